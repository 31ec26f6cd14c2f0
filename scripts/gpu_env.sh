# Sourced by the GPU check scripts on the device machine: puts the CUDA libraries that the
# pip wheels of torch installed (cuBLAS, NVRTC: nvidia/*/lib folders) on LD_LIBRARY_PATH,
# where tandem's dynamic loading finds them.
NV_LIBS=$(python3 - <<'PY'
import glob, os, site
dirs = set()
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    for lib in glob.glob(os.path.join(sp, "nvidia", "**", "lib*.so*"), recursive=True):
        dirs.add(os.path.dirname(lib))
print(":".join(sorted(dirs)))
PY
)
export LD_LIBRARY_PATH="${NV_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
