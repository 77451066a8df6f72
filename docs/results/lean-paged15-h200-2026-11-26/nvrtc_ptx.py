# Compiles an embedded Lean source with libnvrtc as ferrattn-cuda's nvrtc_compile does (same options) and writes it
# under the name nvrtc_ptx() looks for in $FERRATTN_CACHE_DIR: {name}-{arch}-{fnv1a(source):016x}.ptx
import ctypes, sys, os
src_path, arch, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
src = open(src_path, 'rb').read()
h = 0xcbf29ce484222325
for b in src:
    h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
lib = ctypes.CDLL('/work/main/.venv-nvcc/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13')
prog = ctypes.c_void_p()
name = os.path.basename(src_path).replace('.nvrtc.cu', '')
assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, (name + '.cu').encode(), 0, None, None) == 0
opts = [f'--gpu-architecture={arch}'.encode(), b'-std=c++17', b'-default-device']
arr = (ctypes.c_char_p * len(opts))(*opts)
rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
n = ctypes.c_size_t(); lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n)); log = ctypes.create_string_buffer(n.value); lib.nvrtcGetProgramLog(prog, log)
if rc != 0: print(log.value.decode()); sys.exit(1)
lib.nvrtcGetPTXSize(prog, ctypes.byref(n)); ptx = ctypes.create_string_buffer(n.value); lib.nvrtcGetPTX(prog, ptx)
os.makedirs(outdir, exist_ok=True)
out = os.path.join(outdir, f'{name}-{arch}-{h:016x}.ptx')
open(out, 'w').write(ptx.value.decode())
print(out, len(ptx.value))
