"""Builds of llama.cpp that run where they are built: ``llama_build`` (llama-server from
the pinned sdist), ``bindings_build`` (llama-cpp-python the same way), ``cpu_features``,
``build_probe`` (a built binary run before it is kept), ``gpu_toolchains`` (CUDA toolkit,
cuBLAS wheel, Vulkan tools)."""
