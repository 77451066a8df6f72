#!/bin/bash
# build the bench with MAIN's turbo_prefill.cu (a602be2) and -DFERRATTN_WGF_TIMELINE=1 $2 (name $1)
set -e
cd /work/wt/issue-11-prefill20
W=/tmp/p20/nvcc_$1.sh
cat > $W <<EOW
#!/bin/bash
REAL=/work/main/.venv-nvcc/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc
args=(); src=""; out=""; prev=""
for a in "\$@"; do [[ "\$prev" == "-o" ]] && out="\$a"; prev="\$a"; src="\$a"; done
name=\$(basename -- "\$src" .cu)
if [[ "\$name" == turbo_prefill ]]; then
  for a in "\$@"; do [[ "\$a" == "\$src" ]] && a=/work/main/cuda-kernels/turbo_prefill.cu; args+=("\$a"); done
  exec "\$REAL" -DFERRATTN_WGF_TIMELINE=1 $2 "\${args[@]}"
fi
R=/work/main/target/release/build/ferrattn-cuda-461ebf5a70c694ca/out
if [[ -n "\$out" && -f "\$R/\$name.fatbin" && "\$src" == *.cu ]]; then exec cp "\$R/\$name.fatbin" "\$out"; fi
exec "\$REAL" "\$@"
EOW
chmod +x $W
CARGO_INCREMENTAL=0 NVCC=$W cargo build --release -p ferrattn-cuda --bench turbo_prefill 2>&1 | tail -1
f=$(ls -t target/release/deps/turbo_prefill-* | grep -v '\.d$' | head -1)
cp $f /tmp/p20/pk/turbo_prefill_$1
