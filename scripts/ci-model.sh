#!/usr/bin/env bash
# CI for the real-model harness (issue 13): fetches SmolLM2-135M-Instruct (scripts/fetch-smollm2.sh)
# and runs a small `ferrattn repro model-accuracy` on the CPU (256 text tokens, two prompts of 16
# tokens, the exact reference and two algorithms), so the harness cannot rot. Fails when the
# command fails or when the reference perplexity leaves the range a working forward gives
# (a broken tokenizer, RoPE or dequantisation sends it into the hundreds or thousands).
# Takes about a minute of build and a minute of run on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
gguf="$(bash scripts/fetch-smollm2.sh | tail -n 1)"
text=../shared/papers/turboattention-paper.txt
if [ ! -f "$text" ]; then
  echo "ci-model: $text is missing (the papers live in ../shared beside the clone)" >&2
  exit 1
fi
# the harness needs no CUDA kernels: skip nvcc for this release build
FERRATTN_NO_NVCC=1 cargo build --release -p ferrattn-cli --bin ferrattn
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
./target/release/ferrattn repro model-accuracy --model "$gguf" --text "$text" \
  --tokens 256 --prompts 2 --generate 16 --algos lean,turbo-mixed-sas | tee "$out"
# the reference row: | exact | <ppl> | ...; 73.8 measured at 256 tokens on 2026-11-23
ppl="$(awk -F'|' '$2 ~ /^ exact $/ { gsub(/ /, "", $3); print $3 }' "$out")"
awk -v p="$ppl" 'BEGIN { exit !(p > 20 && p < 150) }' || {
  echo "ci-model: reference perplexity '$ppl' is outside 20..150; the forward is broken" >&2
  exit 1
}
echo "ci-model: ok (reference perplexity $ppl)"
