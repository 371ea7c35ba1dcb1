"""The E2B-shaped two-layer model (tests/test_batch_rows.py's E2B_SHAPED) in the file types session 47 left:
Q2_K, Q2_K_S, Q3_K_L, Q4_K_S, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ3_XXS, IQ3_XS, IQ3_S, IQ3_M, IQ2_XXS, IQ2_XS, IQ2_S,
IQ2_M, IQ1_S, IQ1_M. The types llama.cpp quantizes only with an importance matrix get a uniform one (every
column 1.0: the weights' own error measure). Writes <folder>/donor.gguf and <folder>/q<ftype>.gguf; prints each
file type's MLP types."""
import ctypes
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
import llama_cpp
from gguf import GGUFReader
from gguf_exact.tiny.main_model import E2B, TINY, write_donor, write_main_checkpoint
root = Path(sys.argv[1]); root.mkdir(parents=True, exist_ok=True)
spec = replace(E2B, n_layer=2, n_kv_shared=0, n_vocab=TINY.n_vocab)
if not (root / "donor.gguf").exists():
    write_main_checkpoint(root / "src", spec, seed=0)
    write_donor(root / "donor.gguf", root / "src", spec)
NAMES = {10: "Q2_K", 21: "Q2_K_S", 13: "Q3_K_L", 14: "Q4_K_S", 3: "Q4_1", 8: "Q5_0", 9: "Q5_1", 25: "IQ4_NL",
         23: "IQ3_XXS", 22: "IQ3_XS", 26: "IQ3_S", 27: "IQ3_M", 19: "IQ2_XXS", 20: "IQ2_XS", 28: "IQ2_S",
         29: "IQ2_M", 24: "IQ1_S", 31: "IQ1_M"}
NEEDS_IMATRIX = {21, 23, 22, 19, 20, 28, 29, 24, 31}
weights = [t for t in GGUFReader(root / "donor.gguf").tensors if len(t.shape) == 2]
columns = [(ctypes.c_float * int(t.shape[0]))(*([1.0] * int(t.shape[0]))) for t in weights]
imatrix = (llama_cpp.llama_model_imatrix_data * (len(weights) + 1))()
for entry, t, c in zip(imatrix, weights, columns):
    entry.name, entry.data, entry.size = t.name.encode(), ctypes.cast(c, ctypes.POINTER(ctypes.c_float)), len(c)
for ft, name in NAMES.items():
    if len(sys.argv) > 2 and name not in sys.argv[2].split(","):
        continue
    out = root / f"q{ft}.gguf"
    p = llama_cpp.llama_model_quantize_default_params(); p.ftype = ft; p.allow_requantize = True; p.nthread = 2
    if ft in NEEDS_IMATRIX:
        p.imatrix = ctypes.cast(imatrix, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
    rc = llama_cpp.llama_model_quantize(str(root / "donor.gguf").encode(), str(out).encode(), p)
    if rc != 0:
        print(f"{name} ({ft}): llama_model_quantize {rc}"); continue
    types = Counter(t.tensor_type.name for t in GGUFReader(out).tensors if len(t.shape) == 2 and "ffn_" in t.name)
    print(f"{name} ({ft}) q{ft}.gguf MLP: {dict(types)}")
