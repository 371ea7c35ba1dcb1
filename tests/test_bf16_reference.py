"""``repack --bf16`` and ``convert --bf16``: the bf16 reference, the exact file's header over the source's bytes."""

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf_edit import rewrite
from helpers import source_bits

from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.errors import ArgumentError
from gguf_exact.gemma4.assistant import CENTROIDS
from gguf_exact.repack.pipeline import repack_model
from gguf_exact.tiny.main_model import TINY, model_tensors, write_donor, write_main_checkpoint
from gguf_exact.verify import verify_file

BF16, Q4_0 = GGMLQuantizationType.BF16, GGMLQuantizationType.Q4_0
MOSTLY_BF16, MOSTLY_Q4_0 = 32, 2


@pytest.fixture(scope="module")
def main(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bf16-main")
    write_main_checkpoint(root / "src", TINY, seed=0)
    write_donor(root / "donor.gguf", root / "src", TINY)
    repack_model(root / "donor.gguf", root / "src", root / "exact.gguf")
    repack_model(root / "donor.gguf", root / "src", root / "bf16.gguf", bf16_reference=True)
    return root


@pytest.fixture(scope="module")
def drafter(tiny, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bf16-drafter")
    convert_drafter(tiny / "drafter-bf16", root / "exact.gguf", tiny / "target.gguf")
    convert_drafter(tiny / "drafter-bf16", root / "bf16.gguf", tiny / "target.gguf", bf16_reference=True)
    return root


def raw_fields(path) -> dict[str, bytes]:
    return {k: b"".join(p.tobytes() for p in f.parts) for k, f in GGUFReader(path).fields.items()}


def same_header_but_file_type(exact: Path, reference: Path) -> None:
    a, b = raw_fields(exact), raw_fields(reference)
    assert list(a) == list(b)
    assert [k for k in a if a[k] != b[k]] == ["general.file_type"]
    assert GGUFReader(exact).fields["general.file_type"].contents() == MOSTLY_Q4_0
    assert GGUFReader(reference).fields["general.file_type"].contents() == MOSTLY_BF16
    ta, tb = GGUFReader(exact).tensors, GGUFReader(reference).tensors
    assert [(t.name, t.shape.tolist()) for t in ta] == [(t.name, t.shape.tolist()) for t in tb]


def test_main_reference_has_the_exact_files_header_and_the_sources_bits(main):
    same_header_but_file_type(main / "exact.gguf", main / "bf16.gguf")
    ref = {t.name: t for t in GGUFReader(main / "bf16.gguf").tensors}
    donor = {t.name: t for t in GGUFReader(main / "donor.gguf").tensors}
    specs = {t.gguf_name: t for t in model_tensors(TINY)}
    matrices = 0
    for name, t in ref.items():
        spec = specs.get(name)
        if spec is not None and len(spec.shape) >= 2:  # every matrix with a source, Q6_K and F16 ones too
            assert t.tensor_type == BF16, name
            bits = source_bits(main / "src", spec.hf_name)
            assert np.asarray(t.data).view(np.uint16).tobytes() == bits[: t.shape[-1]].tobytes(), name
            matrices += 1
        else:  # norms, scales, rope_freqs: the donor's bytes, as in the exact file
            assert t.tensor_type == donor[name].tensor_type, name
            assert np.asarray(t.data).tobytes() == np.asarray(donor[name].data).tobytes(), name
    assert matrices == 67


def test_drafter_reference_has_the_exact_files_header_and_the_sources_bits(tiny, drafter):
    same_header_but_file_type(drafter / "exact.gguf", drafter / "bf16.gguf")
    exact = {t.name: t for t in GGUFReader(drafter / "exact.gguf").tensors}
    ref = GGUFReader(drafter / "bf16.gguf").tensors
    # the 23 Q4_0 matrices and the ordered head's centroids (off the grid in the tiny drafter, so
    # the exact file keeps them in the source's own bf16 too): every matrix, the source's bits
    assert sum(t.tensor_type == Q4_0 for t in exact.values()) == 23
    assert exact[CENTROIDS].tensor_type == BF16
    assert sum(t.tensor_type == BF16 for t in ref) == 24
    pre = next(t for t in ref if t.name == "nextn.pre_projection.weight")
    assert np.asarray(pre.data).tobytes() == source_bits(tiny / "drafter-bf16", "pre_projection.weight").tobytes()
    for t in ref:  # F32 norms and rope_freqs exactly as the exact file has them
        if t.tensor_type != BF16:
            assert np.asarray(t.data).tobytes() == np.asarray(exact[t.name].data).tobytes(), t.name


def test_verify_holds_a_reference_to_the_sources_bits(tiny, main, drafter):
    v = verify_file(main / "bf16.gguf", main / "src", donor=main / "donor.gguf")
    assert v.ok() and v.writer == "repack --bf16"
    assert "a bf16 reference: 67 matrices, 5,898,240 values, the source's bytes" in v.verdict()
    d = verify_file(drafter / "bf16.gguf", tiny / "drafter-bf16", vocab_from=tiny / "target.gguf")
    assert d.ok() and d.writer == "convert --bf16" and "a bf16 reference: 24 matrices" in d.verdict()
    assert verify_file(main / "exact.gguf", main / "src", donor=main / "donor.gguf").writer == "repack"


def test_verify_fails_a_reference_with_one_value_changed(main, tmp_path):
    def flip(name, data):
        if name == "blk.3.ffn_down.weight":
            data = data.copy()
            data.reshape(-1)[5] ^= 1  # one bit of one byte: value 2's low mantissa bit
        return data

    broken = rewrite(main / "bf16.gguf", tmp_path / "broken.gguf", change=flip)
    v = verify_file(broken, main / "src", donor=main / "donor.gguf")
    assert not v.ok()
    assert len(v.failures) == 1 and "tensor blk.3.ffn_down.weight" in str(v.failures[0])


def test_off_grid_choice_does_not_apply_to_a_reference(main, tmp_path):
    with pytest.raises(ArgumentError, match="does not apply to a bf16 reference"):
        repack_model(main / "donor.gguf", main / "src", tmp_path / "x.gguf", off_grid="f16", bf16_reference=True)
    assert not (tmp_path / "x.gguf").exists()
