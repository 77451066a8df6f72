//! The compressed KV cache and its INT8 decode buffer (TurboAttention sections 3.1-3.3,
//! Alg. 1 "write K_j^q2 ... to HBM", Alg. 2 inputs).
//!
//! Per sequence, per KV head and separately for K and V ([`TensorCache`]):
//! - `blocks`: full blocks of `B_c` tokens, each INT8-quantized with one scale (BPQ stage 1)
//!   and then INT4/INT2 channelwise (stage 2) at the head's bit width ([`PackedBlock`]);
//! - `buffer`: the last `len % B_c` tokens (the enhanced KV buffer of section 3.3) as INT8
//!   codes under one *universal* scale, clamped to `[-127, 127]`.
//!
//! Invariant (tested): `blocks.len() == len / B_c` and `buffer.tokens == len % B_c`, since the
//! buffer capacity `n_b` equals `B_c` and a full buffer is flushed at once into one block with
//! the universal scale as its INT8 scale (no re-quantization of the INT8 codes, section 3.3).
//!
//! Building from a context (the prefill): full blocks use the per-block scale
//! `max|x| / 119` of Alg. 1, so they hold exactly the INT8 codes the prefill attention used;
//! the tail that does not fill a block goes into the buffer. The universal scale of a
//! (sequence, head, tensor) is `max|x| / 119` over *all* its context tokens; a cache that
//! starts empty (or whose context is all zeros) takes it from the first appended token with a
//! non-zero value. Tokens appended later are clamped to `127 x scale`: the 119-vs-127 headroom
//! absorbs up to 6.7% growth before clamping bites.
//!
//! Memory accounting counts exactly what a device would store: packed codes, one `u8` scale
//! and one `i8` zero point per channel and block, one `f32` INT8 scale per block, the buffer's
//! INT8 codes and one `f32` universal scale per (sequence, head, tensor).

use super::heads;
use super::quant::{int8_scale, packed_block_bytes, quantize_int8, Int8Block, PackedBlock};
use super::{KvBits, TurboConfig};
use crate::{CoreError, DType, Result, Tensor};

/// INT8 decode buffer of one tensor of one head of one sequence (section 3.3).
#[derive(Clone, Debug, PartialEq)]
pub struct Int8Buffer {
    /// Universal scale (value units per code); `None` until non-zero data fixed it.
    pub scale: Option<f32>,
    /// Tokens held (`< n_b`).
    pub tokens: usize,
    /// `tokens x d` codes, row-major, each in `[-127, 127]`.
    pub codes: Vec<i8>,
}

/// K or V of one head of one sequence: compressed blocks, then the INT8 buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorCache {
    /// Full compressed blocks in token order.
    pub blocks: Vec<PackedBlock>,
    /// The tokens after the last full block.
    pub buffer: Int8Buffer,
}

impl TensorCache {
    fn empty() -> TensorCache {
        TensorCache {
            blocks: Vec::new(),
            buffer: Int8Buffer {
                scale: None,
                tokens: 0,
                codes: Vec::new(),
            },
        }
    }

    /// Appends one token row; flushes the buffer into a block of `bits` when it reaches `n_b`.
    fn push(&mut self, row: &[f32], n_b: usize, bits: u8) {
        let buf = &mut self.buffer;
        if buf.scale.is_none() {
            let s = int8_scale(row);
            if s > 0.0 {
                buf.scale = Some(s);
            }
        }
        let s = buf.scale.unwrap_or(0.0);
        buf.codes.extend(row.iter().map(|&x| quantize_int8(x, s)));
        buf.tokens += 1;
        if buf.tokens == n_b {
            let block = Int8Block {
                scale: s,
                rows: n_b,
                codes: std::mem::take(&mut buf.codes),
            };
            self.blocks
                .push(PackedBlock::compress(&block, row.len(), bits));
            buf.tokens = 0;
        }
    }

    /// The INT8 tiles attention iterates over: every block decompressed, then the buffer if it
    /// holds tokens.
    pub fn int8_tiles(&self) -> Vec<Int8Block> {
        let mut tiles: Vec<Int8Block> = self.blocks.iter().map(PackedBlock::decompress).collect();
        if self.buffer.tokens > 0 {
            tiles.push(Int8Block {
                scale: self.buffer.scale.unwrap_or(0.0),
                rows: self.buffer.tokens,
                codes: self.buffer.codes.clone(),
            });
        }
        tiles
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.blocks.iter().map(|b| b.tokens).sum::<usize>() + self.buffer.tokens
    }

    /// Whether no token is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn bytes(&self) -> (usize, usize) {
        let compressed = self.blocks.iter().map(PackedBlock::bytes).sum();
        (compressed, self.buffer.codes.len() + 4)
    }
}

/// Cache of one sequence: per KV head, K and V.
#[derive(Clone, Debug, PartialEq)]
pub struct SeqCache {
    /// Keys, one entry per KV head.
    pub k: Vec<TensorCache>,
    /// Values, one entry per KV head.
    pub v: Vec<TensorCache>,
}

impl SeqCache {
    /// Tokens held (the same for every head and for K and V).
    pub fn len(&self) -> usize {
        self.k.first().map_or(0, TensorCache::len)
    }

    /// Whether no token is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Memory held by a cache, and how it compares with an fp16 cache of the same tokens.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CacheMemory {
    /// Tokens over all sequences.
    pub tokens: usize,
    /// Bytes of compressed blocks (codes, per-channel scale and zero point, f32 block scales).
    pub compressed_bytes: usize,
    /// Bytes of the INT8 buffers (codes held) and their f32 universal scales.
    pub buffer_bytes: usize,
    /// Bytes the same tokens take as fp16 K and V: `tokens x heads_kv x d x 2 x 2`.
    pub fp16_bytes: usize,
    /// `(compressed_bytes + buffer_bytes) / tokens`, all heads, K and V (0 for no token).
    pub bytes_per_token: f64,
    /// `fp16_bytes / (compressed_bytes + buffer_bytes)`.
    pub compression_ratio: f64,
}

impl CacheMemory {
    /// Accounting for `tokens` tokens of `heads_kv` heads of width `head_dim` held in
    /// `compressed_bytes` of blocks and `buffer_bytes` of INT8 buffers.
    pub fn new(
        tokens: usize,
        heads_kv: usize,
        head_dim: usize,
        compressed_bytes: usize,
        buffer_bytes: usize,
    ) -> CacheMemory {
        let fp16_bytes = tokens * heads_kv * head_dim * 2 * DType::F16.size_bytes();
        let held = compressed_bytes + buffer_bytes;
        CacheMemory {
            tokens,
            compressed_bytes,
            buffer_bytes,
            fp16_bytes,
            bytes_per_token: if tokens == 0 {
                0.0
            } else {
                held as f64 / tokens as f64
            },
            compression_ratio: if held == 0 {
                0.0
            } else {
                fp16_bytes as f64 / held as f64
            },
        }
    }
}

/// The TurboAttention KV cache of a batch: per-head bit widths, compressed blocks, INT8 buffers.
#[derive(Clone, Debug, PartialEq)]
pub struct TurboKvCache {
    /// Channels per K and V row (head dimension; K and V share it).
    pub head_dim: usize,
    /// Key/value heads.
    pub heads_kv: usize,
    /// Tokens per compressed block (`B_c`) and buffer capacity (`n_b`).
    pub block_tokens: usize,
    /// Bits of every KV head's compressed blocks (2 or 4), same for every sequence.
    pub bits: Vec<u8>,
    /// One entry per sequence of the batch.
    pub seqs: Vec<SeqCache>,
}

impl TurboKvCache {
    /// An empty cache for `batch` sequences with explicit per-head bits.
    pub fn empty(
        cfg: &TurboConfig,
        batch: usize,
        heads_kv: usize,
        head_dim: usize,
        bits: Vec<u8>,
    ) -> Result<TurboKvCache> {
        cfg.validate()?;
        super::check_head_dim(head_dim, head_dim, crate::BackendKind::Cpu)?;
        check_bits(&bits, heads_kv)?;
        let seq = SeqCache {
            k: vec![TensorCache::empty(); heads_kv],
            v: vec![TensorCache::empty(); heads_kv],
        };
        Ok(TurboKvCache {
            head_dim,
            heads_kv,
            block_tokens: cfg.block_k,
            bits,
            seqs: vec![seq; batch],
        })
    }

    /// Compresses the first `seqlens[b]` tokens of every sequence of `k`, `v` (`[B, S, Hk, D]`),
    /// choosing per-head bits from `cfg.kv_bits` (priorities measured on these tokens).
    pub fn from_context(
        cfg: &TurboConfig,
        k: &Tensor,
        v: &Tensor,
        seqlens: &[usize],
    ) -> Result<TurboKvCache> {
        cfg.validate()?;
        check_kv(k, v, seqlens)?;
        let (batch, heads_kv, d) = (k.shape[0], k.shape[2], k.shape[3]);
        super::check_head_dim(d, v.shape[3], crate::BackendKind::Cpu)?;
        let bits = resolve_bits(&cfg.kv_bits, k, v, seqlens)?;
        let bc = cfg.block_k;
        let compress = |x: &Tensor, b: usize, h: usize, bits: u8| -> TensorCache {
            let n = seqlens[b];
            let rows: Vec<&[f32]> = (0..n).map(|j| x.row4(b, j, h)).collect();
            let full = n / bc;
            let blocks = (0..full)
                .map(|j| {
                    PackedBlock::compress(
                        &Int8Block::quantize(&rows[j * bc..(j + 1) * bc]),
                        d,
                        bits,
                    )
                })
                .collect();
            let universal = int8_scale(rows.iter().flat_map(|r| r.iter()));
            let scale = (universal > 0.0).then_some(universal);
            let tail = Int8Block::quantize_with_scale(&rows[full * bc..], universal);
            TensorCache {
                blocks,
                buffer: Int8Buffer {
                    scale,
                    tokens: tail.rows,
                    codes: tail.codes,
                },
            }
        };
        let seqs = (0..batch)
            .map(|b| SeqCache {
                k: (0..heads_kv).map(|h| compress(k, b, h, bits[h])).collect(),
                v: (0..heads_kv).map(|h| compress(v, b, h, bits[h])).collect(),
            })
            .collect();
        Ok(TurboKvCache {
            head_dim: d,
            heads_kv,
            block_tokens: bc,
            bits,
            seqs,
        })
    }

    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.seqs.len()
    }

    /// Tokens held for sequence `b`.
    pub fn len(&self, b: usize) -> usize {
        self.seqs[b].len()
    }

    /// Whether sequence `b` holds no token.
    pub fn is_empty(&self, b: usize) -> bool {
        self.len(b) == 0
    }

    /// Tokens of sequence `b` held in compressed blocks.
    pub fn compressed_tokens(&self, b: usize) -> usize {
        self.seqs[b]
            .k
            .first()
            .map_or(0, |t| t.blocks.len() * self.block_tokens)
    }

    /// Tokens of sequence `b` held in the INT8 buffer.
    pub fn buffered_tokens(&self, b: usize) -> usize {
        self.seqs[b].k.first().map_or(0, |t| t.buffer.tokens)
    }

    /// Appends one token to sequence `b`: `k` and `v` hold `heads_kv x head_dim` values
    /// (head-major, as a `[Hk, D]` row of a `[B, S, Hk, D]` tensor). Flushes a full buffer.
    pub fn append_token(&mut self, b: usize, k: &[f32], v: &[f32]) -> Result<()> {
        if b >= self.seqs.len() {
            return Err(CoreError::BadLength {
                what: "sequence index".into(),
                value: b as i64,
                requirement: format!("below the cache's batch of {}", self.seqs.len()),
            });
        }
        let want = self.heads_kv * self.head_dim;
        for (name, x) in [("k_new", k), ("v_new", v)] {
            if x.len() != want {
                return Err(CoreError::Shape {
                    tensor: name,
                    actual: vec![x.len()],
                    expected: format!(
                        "{want} values (heads_kv {} x head_dim {})",
                        self.heads_kv, self.head_dim
                    ),
                });
            }
            super::check_values(name, x)?;
        }
        self.seqs[b].push_token(k, v, self.head_dim, self.block_tokens, &self.bits);
        Ok(())
    }

    /// Appends one token to every sequence: `k`, `v` are `[B, 1, Hk, D]`.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<()> {
        let want = [self.seqs.len(), 1, self.heads_kv, self.head_dim];
        for (name, x) in [("k_new", k), ("v_new", v)] {
            if x.shape != want {
                return Err(CoreError::Shape {
                    tensor: name,
                    actual: x.shape.clone(),
                    expected: format!(
                        "{want:?} (batch, one token, heads_kv, head_dim of the cache)"
                    ),
                });
            }
            x.check_data(name)?;
        }
        let row = self.heads_kv * self.head_dim;
        for b in 0..self.seqs.len() {
            self.append_token(
                b,
                &k.data[b * row..(b + 1) * row],
                &v.data[b * row..(b + 1) * row],
            )?;
        }
        Ok(())
    }

    /// INT8 tiles of K and V of sequence `b`, head `h`, in token order (blocks, then buffer).
    pub fn int8_tiles(&self, b: usize, h: usize) -> (Vec<Int8Block>, Vec<Int8Block>) {
        (
            self.seqs[b].k[h].int8_tiles(),
            self.seqs[b].v[h].int8_tiles(),
        )
    }

    /// Reconstructed values (INT8 code x scale) of K and V of sequence `b`, head `h`,
    /// `len x head_dim` each.
    pub fn dequantize(&self, b: usize, h: usize) -> (Vec<f32>, Vec<f32>) {
        let (k, v) = self.int8_tiles(b, h);
        let flat = |t: Vec<Int8Block>| t.iter().flat_map(|b| b.dequantize()).collect();
        (flat(k), flat(v))
    }

    /// Memory held, counted from the stored buffers themselves.
    pub fn memory(&self) -> CacheMemory {
        let (mut compressed, mut buffer, mut tokens) = (0, 0, 0);
        for s in &self.seqs {
            tokens += s.len();
            for t in s.k.iter().chain(&s.v) {
                let (c, b) = t.bytes();
                compressed += c;
                buffer += b;
            }
        }
        CacheMemory::new(tokens, self.heads_kv, self.head_dim, compressed, buffer)
    }
}

impl SeqCache {
    /// Appends one token (`heads x d` values of K and of V), flushing full buffers.
    pub(crate) fn push_token(&mut self, k: &[f32], v: &[f32], d: usize, n_b: usize, bits: &[u8]) {
        for (h, &bh) in bits.iter().enumerate() {
            self.k[h].push(&k[h * d..(h + 1) * d], n_b, bh);
            self.v[h].push(&v[h * d..(h + 1) * d], n_b, bh);
        }
    }
}

/// Compression ratio against fp16 of full compressed blocks alone (the steady state of a long
/// cache, buffer excluded): `heads x 2 x T x d x 2 bytes` over the blocks' bytes.
pub fn block_compression_ratio(head_dim: usize, block_tokens: usize, bits: &[u8]) -> f64 {
    let fp16 = bits.len() * 2 * block_tokens * head_dim * 2;
    let packed: usize = bits
        .iter()
        .map(|&b| 2 * packed_block_bytes(block_tokens, head_dim, b))
        .sum();
    fp16 as f64 / packed as f64
}

fn check_bits(bits: &[u8], heads_kv: usize) -> Result<()> {
    if bits.len() != heads_kv {
        return Err(CoreError::Shape {
            tensor: "kv_bits",
            actual: vec![bits.len()],
            expected: format!("one bit width per KV head, [{heads_kv}]"),
        });
    }
    if let Some((h, &b)) = bits.iter().enumerate().find(|(_, &b)| b != 2 && b != 4) {
        return Err(CoreError::Unsupported {
            what: format!("{b} bits for KV head {h}"),
            supported: "2 or 4".into(),
        });
    }
    Ok(())
}

fn check_kv(k: &Tensor, v: &Tensor, seqlens: &[usize]) -> Result<()> {
    if k.shape.len() != 4 {
        return Err(CoreError::Shape {
            tensor: "k",
            actual: k.shape.clone(),
            expected: "rank 4 [batch, seq_k, heads_kv, head_dim]".into(),
        });
    }
    if v.shape.len() != 4 || v.shape[..3] != k.shape[..3] {
        return Err(CoreError::Shape {
            tensor: "v",
            actual: v.shape.clone(),
            expected: format!(
                "[{}, {}, {}, head_dim_v] to match k {:?}",
                k.shape[0], k.shape[1], k.shape[2], k.shape
            ),
        });
    }
    if seqlens.len() != k.shape[0] {
        return Err(CoreError::Shape {
            tensor: "seqlens_k",
            actual: vec![seqlens.len()],
            expected: format!("[{}], one length per sequence", k.shape[0]),
        });
    }
    for (b, &n) in seqlens.iter().enumerate() {
        if n > k.shape[1] {
            return Err(CoreError::BadLength {
                what: format!("seqlens_k[{b}]"),
                value: n as i64,
                requirement: format!("at most {}, the k tensor's sequence extent", k.shape[1]),
            });
        }
    }
    for (name, t) in [("k", k), ("v", v)] {
        t.check_data(name)?;
        super::check_values(name, &t.data)?;
    }
    Ok(())
}

/// Bits per KV head for a context, from the configured policy.
pub fn resolve_bits(policy: &KvBits, k: &Tensor, v: &Tensor, seqlens: &[usize]) -> Result<Vec<u8>> {
    let heads_kv = k.shape[2];
    let bits = match policy {
        KvBits::Int4 => vec![4; heads_kv],
        KvBits::Int2 => vec![2; heads_kv],
        KvBits::Mixed { two_bit_fraction } => {
            let pr = heads::head_priorities(k, v, seqlens);
            heads::assign_bits(&pr, heads::two_bit_heads(*two_bit_fraction, heads_kv))
        }
        KvBits::PerHead { bits } => bits.clone(),
    };
    check_bits(&bits, heads_kv)?;
    Ok(bits)
}
