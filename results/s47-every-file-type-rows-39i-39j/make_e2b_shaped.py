"""The E2B-shaped two-layer model (tests/test_batch_rows.py's E2B_SHAPED) and its file types, in a folder given."""
import sys
from dataclasses import replace
from pathlib import Path
import llama_cpp
from gguf_exact.tiny.main_model import E2B, TINY, write_donor, write_main_checkpoint
root = Path(sys.argv[1]); root.mkdir(parents=True, exist_ok=True)
spec = replace(E2B, n_layer=2, n_kv_shared=0, n_vocab=TINY.n_vocab)
write_main_checkpoint(root / "src", spec, seed=0)
write_donor(root / "donor.gguf", root / "src", spec)
for ft in (15, 16, 17, 18, 7, 1, 32, 0):
    p = llama_cpp.llama_model_quantize_default_params(); p.ftype = ft; p.allow_requantize = True; p.nthread = 2
    assert llama_cpp.llama_model_quantize(str(root / "donor.gguf").encode(), str(root / f"q{ft}.gguf").encode(), p) == 0
