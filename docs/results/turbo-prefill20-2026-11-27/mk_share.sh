#!/bin/bash
# build the bench with -DFERRATTN_WGF_MAD_HI_EVERY=$1 (turbo_prefill.cu only; other fatbins reused)
set -e
cd /work/wt/issue-11-prefill20
W=/tmp/p20/nvcc_e$1.sh
cat > $W <<EOW
#!/bin/bash
REAL=/work/main/.venv-nvcc/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc
src=""; out=""; prev=""
for a in "\$@"; do [[ "\$prev" == "-o" ]] && out="\$a"; prev="\$a"; src="\$a"; done
name=\$(basename -- "\$src" .cu)
[[ "\$name" == turbo_prefill ]] && exec "\$REAL" -DFERRATTN_WGF_MAD_HI_EVERY=$1 "\$@"
R=/work/main/target/release/build/ferrattn-cuda-461ebf5a70c694ca/out
if [[ -n "\$out" && -f "\$R/\$name.fatbin" && "\$src" == *.cu ]]; then exec cp "\$R/\$name.fatbin" "\$out"; fi
exec "\$REAL" "\$@"
EOW
chmod +x $W
CARGO_INCREMENTAL=0 NVCC=$W cargo build --release -p ferrattn-cuda --bench turbo_prefill 2>&1 | tail -1
f=$(ls -t target/release/deps/turbo_prefill-* | grep -v '\.d$' | head -1)
cp $f /tmp/p20/pk/turbo_prefill_e$1
/tmp/d13/tools/nvidia/cu13/bin/cuobjdump -sass -fun turbo_prefill_wgf_bf16_d128 target/release/build/ferrattn-cuda-461ebf5a70c694ca/out/turbo_prefill.fatbin | grep -c IMAD.HI
