//! The GPT-2 style byte-level BPE tokenizer stored in a GGUF file (`tokenizer.ggml.model = gpt2`).
//!
//! Encoding, as SmolLM2's `tokenizer.json` defines it (`Digits(individual_digits)` then
//! `ByteLevel`; llama.cpp's `smollm` pre-tokenizer is the same two regexes):
//! 1. control and user-defined tokens (`<|im_start|>`, `<|endoftext|>`, ...) are matched
//!    literally and emitted as their ids;
//! 2. every digit becomes a piece of its own;
//! 3. the rest is split by GPT-2's pattern
//!    `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`;
//! 4. each piece's UTF-8 bytes are mapped to printable characters (GPT-2 `bytes_to_unicode`),
//!    and adjacent symbols are merged, lowest merge rank first, until no ranked pair remains.
//!
//! `\p{L}` is approximated by [`char::is_alphabetic`] and `\p{N}` by [`char::is_numeric`]; they
//! differ only on rare code points (e.g. combining marks that are `Alphabetic` but not letters),
//! none of which occur in the English texts the accuracy harness uses.

use super::gguf::{Gguf, Value};
use super::ModelError;
use std::collections::HashMap;

/// A byte-level BPE tokenizer.
pub struct Tokenizer {
    tokens: Vec<String>,
    ids: HashMap<String, u32>,
    ranks: HashMap<(String, String), usize>,
    /// Control and user-defined tokens, longest first (so the longest literal wins).
    specials: Vec<(String, u32)>,
    byte_to_char: [char; 256],
    char_to_byte: HashMap<char, u8>,
    /// Beginning-of-sequence id.
    pub bos: u32,
    /// End-of-sequence id.
    pub eos: u32,
}

/// GPT-2's reversible map from bytes to printable characters: printable Latin-1 bytes map to
/// themselves, the other 68 to U+0100 onwards in byte order.
fn bytes_to_unicode() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
        map[b as usize] = if printable {
            char::from_u32(b).expect("Latin-1 is valid")
        } else {
            next += 1;
            char::from_u32(next - 1).expect("U+0100.. are valid")
        };
    }
    map
}

impl Tokenizer {
    /// Reads the vocabulary, token types and merges from GGUF metadata.
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer, ModelError> {
        let model = g.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(ModelError::Tokenizer(format!(
                "tokenizer.ggml.model is {model:?}; only the byte-level BPE \"gpt2\" is implemented"
            )));
        }
        let strings = |key: &str| -> Result<Vec<String>, ModelError> {
            g.get_array(key)?
                .iter()
                .map(|v| match v {
                    Value::Str(s) => Ok(s.clone()),
                    _ => Err(ModelError::WrongType {
                        key: key.into(),
                        expected: "array of strings",
                        actual: "array of other values",
                    }),
                })
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        let types: Vec<i64> = match g.get_array("tokenizer.ggml.token_type") {
            Ok(a) => a
                .iter()
                .map(|v| match v {
                    Value::I64(x) => *x,
                    Value::U64(x) => *x as i64,
                    _ => 1,
                })
                .collect(),
            Err(ModelError::MissingKey(_)) => vec![1; tokens.len()],
            Err(e) => return Err(e),
        };
        let ids: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let mut ranks = HashMap::with_capacity(merges.len());
        for (r, m) in merges.iter().enumerate() {
            let (a, b) = m.split_once(' ').ok_or_else(|| {
                ModelError::Tokenizer(format!("merge {r} ({m:?}) is not two symbols"))
            })?;
            ranks.insert((a.to_string(), b.to_string()), r);
        }
        // ggml token types: 3 control, 4 user defined
        let mut specials: Vec<(String, u32)> = tokens
            .iter()
            .zip(&types)
            .enumerate()
            .filter(|(_, (t, &ty))| (ty == 3 || ty == 4) && !t.is_empty())
            .map(|(i, (t, _))| (t.clone(), i as u32))
            .collect();
        specials.sort_by_key(|s| std::cmp::Reverse(s.0.len()));
        let byte_to_char = bytes_to_unicode();
        let char_to_byte = byte_to_char
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        let id = |key: &str| -> Result<u32, ModelError> {
            let i = g.get_usize(key)?;
            if i >= tokens.len() {
                return Err(ModelError::Tokenizer(format!(
                    "{key} = {i} is outside the vocabulary of {}",
                    tokens.len()
                )));
            }
            Ok(i as u32)
        };
        Ok(Tokenizer {
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            tokens,
            ids,
            ranks,
            specials,
            byte_to_char,
            char_to_byte,
        })
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// Token ids of `text` (no BOS is added: SmolLM2 sets `add_bos_token = false`).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let mut out = Vec::new();
        let mut rest = text;
        // the earliest special token, the longest at a tie
        while let Some((at, len, id)) = self
            .specials
            .iter()
            .filter_map(|(s, id)| rest.find(s.as_str()).map(|at| (at, s.len(), *id)))
            .min_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        {
            self.encode_plain(&rest[..at], &mut out)?;
            out.push(id);
            rest = &rest[at + len..];
        }
        self.encode_plain(rest, &mut out)?;
        Ok(out)
    }

    fn encode_plain(&self, text: &str, out: &mut Vec<u32>) -> Result<(), ModelError> {
        let chars: Vec<char> = text.chars().collect();
        let mut start = 0;
        // step 2: digits are pieces of their own; step 3 splits the runs between them
        for i in 0..=chars.len() {
            if i == chars.len() || chars[i].is_numeric() {
                for piece in gpt2_pieces(&chars[start..i]) {
                    self.bpe(piece, out)?;
                }
                if i < chars.len() {
                    self.bpe(&chars[i..i + 1], out)?;
                }
                start = i + 1;
            }
        }
        Ok(())
    }

    fn bpe(&self, piece: &[char], out: &mut Vec<u32>) -> Result<(), ModelError> {
        let s: String = piece.iter().collect();
        let mut syms: Vec<String> = s
            .bytes()
            .map(|b| self.byte_to_char[b as usize].to_string())
            .collect();
        while syms.len() > 1 {
            let best = syms
                .windows(2)
                .enumerate()
                .filter_map(|(i, w)| {
                    self.ranks
                        .get(&(w[0].clone(), w[1].clone()))
                        .map(|&r| (r, i))
                })
                .min();
            let Some((_, i)) = best else { break };
            let merged = format!("{}{}", syms[i], syms[i + 1]);
            syms.splice(i..i + 2, [merged]);
        }
        for sym in syms {
            let id = self.ids.get(&sym).ok_or_else(|| {
                ModelError::Tokenizer(format!(
                    "symbol {sym:?} of piece {s:?} is not in the vocabulary"
                ))
            })?;
            out.push(*id);
        }
        Ok(())
    }

    /// The text of token ids (special tokens as their literal text).
    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        let mut bytes = Vec::new();
        for &id in ids {
            let t = self.tokens.get(id as usize).ok_or_else(|| {
                ModelError::Tokenizer(format!(
                    "token id {id} is outside the vocabulary of {}",
                    self.tokens.len()
                ))
            })?;
            if self.specials.iter().any(|(_, s)| *s == id) {
                bytes.extend(t.as_bytes());
                continue;
            }
            for c in t.chars() {
                match self.char_to_byte.get(&c) {
                    Some(&b) => bytes.push(b),
                    None => bytes.extend(c.to_string().as_bytes()),
                }
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// GPT-2's split pattern (module docs, step 3) over a run of characters with no digits.
fn gpt2_pieces(c: &[char]) -> Vec<&[char]> {
    let letter = |x: char| x.is_alphabetic();
    let number = |x: char| x.is_numeric();
    let other = |x: char| !x.is_whitespace() && !letter(x) && !number(x);
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let run = |from: usize, f: &dyn Fn(char) -> bool| {
            let mut e = from;
            while e < c.len() && f(c[e]) {
                e += 1;
            }
            e
        };
        let next = c.get(i + 1).copied();
        let end = if c[i] == '\'' && matches!(next, Some('s' | 't' | 'm' | 'd')) {
            i + 2
        } else if c[i] == '\''
            && matches!(
                (next, c.get(i + 2)),
                (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))
            )
        {
            i + 3
        } else {
            // ` ?X+` for X = letters, numbers, other: an optional leading space
            let body = if c[i] == ' ' { i + 1 } else { i };
            let class: Option<&dyn Fn(char) -> bool> = match c.get(body) {
                Some(&x) if letter(x) => Some(&letter),
                Some(&x) if number(x) => Some(&number),
                Some(&x) if other(x) => Some(&other),
                _ => None,
            };
            match class {
                Some(f) => run(body, f),
                None => {
                    // whitespace: `\s+(?!\S)` keeps the last space for the next word, `\s+`
                    // takes a lone one
                    let e = run(i, &|x: char| x.is_whitespace());
                    if e == c.len() || e - i == 1 {
                        e
                    } else {
                        e - 1
                    }
                }
            }
        };
        out.push(&c[i..end]);
        i = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(s: &str) -> Vec<String> {
        let c: Vec<char> = s.chars().collect();
        gpt2_pieces(&c).iter().map(|p| p.iter().collect()).collect()
    }

    #[test]
    fn gpt2_split_pattern() {
        assert_eq!(
            pieces("Hello world's  end!\n\nok  "),
            ["Hello", " world", "'s", " ", " end", "!", "\n", "\n", "ok", "  "]
        );
        assert_eq!(pieces("a  ,b"), ["a", " ", " ,", "b"]);
        assert_eq!(pieces("we'll"), ["we", "'ll"]);
    }

    #[test]
    fn byte_map_is_a_bijection() {
        let m = bytes_to_unicode();
        let set: std::collections::HashSet<char> = m.iter().copied().collect();
        assert_eq!(set.len(), 256);
        assert_eq!(m[b' ' as usize], '\u{120}');
        assert_eq!(m[b'A' as usize], 'A');
    }
}
