"""Requantize a GGUF with the bindings' llama_model_quantize: quantize.py IN OUT LLAMA_FTYPE."""
import sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = int(sys.argv[3]); p.allow_requantize = True; p.nthread = 2
assert llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p) == 0
