"""``repack --bf16`` and ``convert --bf16``: the bf16 reference, the exact file's header over the source's bytes;
``convert --llama-q8-0``: that header over llama.cpp's Q8_0 of the source (gguf-py's ``quantize``)."""

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType, GGUFReader, quants
from gguf_edit import rewrite
from helpers import source_bits

from gguf_exact.cli import main as cli_main
from gguf_exact.core import bf16
from gguf_exact.drafter.convert import convert_drafter, convert_llama_q8_0
from gguf_exact.errors import ArgumentError
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.formats.gguf_file import sha256_file
from gguf_exact.gemma4.assistant import CENTROIDS, gguf_tensor_name
from gguf_exact.repack.pipeline import repack_model
from gguf_exact.tiny.main_model import TINY, model_tensors, write_donor, write_main_checkpoint
from gguf_exact.tiny.models import TinyDrafter, drafter_config, drafter_tensors, write_checkpoint
from gguf_exact.verify import verify_file

BF16, Q4_0, Q8_0, F32 = (
    GGMLQuantizationType.BF16,
    GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q8_0,
    GGMLQuantizationType.F32,
)
MOSTLY_BF16, MOSTLY_Q4_0, MOSTLY_Q8_0 = 32, 2, 7


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
    convert_llama_q8_0(tiny / "drafter-bf16", root / "q8_0.gguf", tiny / "target.gguf")
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


def test_llama_q8_0_is_gguf_pys_q8_0_of_the_source_under_the_references_header(tiny, drafter):
    ref, q8 = raw_fields(drafter / "bf16.gguf"), raw_fields(drafter / "q8_0.gguf")
    assert list(ref) == list(q8)
    assert [k for k in ref if ref[k] != q8[k]] == ["general.file_type"]  # every other key, byte for byte
    assert GGUFReader(drafter / "q8_0.gguf").fields["general.file_type"].contents() == MOSTLY_Q8_0
    reference = {t.name: t for t in GGUFReader(drafter / "bf16.gguf").tensors}
    tensors = GGUFReader(drafter / "q8_0.gguf").tensors
    assert [(t.name, t.shape.tolist()) for t in tensors] == [(n, t.shape.tolist()) for n, t in reference.items()]
    with Checkpoint(tiny / "drafter-bf16") as ckpt:
        hf = {gguf_tensor_name(name): name for name in ckpt.tensors}
    counts = {}
    for t in tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        data = np.asarray(t.data).tobytes()
        if t.tensor_type == Q8_0:  # every matrix, the ordered head's centroids too
            values = bf16.to_f32(source_bits(tiny / "drafter-bf16", hf[t.name]))
            assert data == quants.quantize(values, Q8_0).tobytes(), t.name
            assert len(data) == values.size // 32 * 34, t.name
        elif t.name in hf and t.tensor_type == F32:  # norms and layer scalars: the source's values, every bit
            assert data == bf16.to_f32(source_bits(tiny / "drafter-bf16", hf[t.name])).reshape(-1).tobytes(), t.name
        else:  # rope_freqs and the token ordering: as the reference has them
            assert data == np.asarray(reference[t.name].data).tobytes(), t.name
    assert counts == {"Q8_0": 24, "F32": 26, "I32": 1}
    assert (drafter / "q8_0.gguf").stat().st_size == 260_800


def one_error_line(args: list) -> str:
    result = CliRunner().invoke(cli_main, [str(a) for a in args])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_llama_q8_0_refuses_a_checkpoint_missing_a_tensor_and_an_output_that_is_an_input(tiny, tmp_path):
    tensors = drafter_tensors(TinyDrafter(), seed=1)
    del tensors["model.layers.1.mlp.down_proj.weight"]
    broken = write_checkpoint(tmp_path / "broken-hf", drafter_config(TinyDrafter()), tensors)
    (tmp_path / "out").mkdir()
    line = one_error_line(
        ["convert", "--llama-q8-0", broken, tmp_path / "out" / "d.gguf", "--vocab-from", tiny / "target.gguf"]
    )
    assert "no source tensor for blk.1.ffn_down.weight" in line
    assert list((tmp_path / "out").iterdir()) == []  # nothing half-written
    target = tiny / "target.gguf"
    before = sha256_file(target)
    line = one_error_line(["convert", "--llama-q8-0", tiny / "drafter-bf16", target, "--vocab-from", target])
    assert "the output is the --vocab-from" in line and sha256_file(target) == before
    line = one_error_line(["convert", "--llama-q8-0", "--bf16", tiny / "drafter-bf16", tmp_path / "out" / "d.gguf",
                           "--vocab-from", target])  # fmt: skip
    assert "--bf16 does not apply with --llama-q8-0" in line and list((tmp_path / "out").iterdir()) == []


def test_verify_holds_a_llama_q8_0_file_to_gguf_pys_bytes_and_fails_one_changed(tiny, drafter, tmp_path):
    v = verify_file(drafter / "q8_0.gguf", tiny / "drafter-bf16", vocab_from=tiny / "target.gguf")
    assert v.ok() and v.writer == "convert --llama-q8-0"
    assert "llama.cpp's Q8_0 way: 24 matrices, 227,328 values, gguf-py's quantize" in v.verdict()

    def flip(name, data):
        if name == "blk.2.ffn_up.weight":
            data = data.copy()
            data.reshape(-1)[40] ^= 1  # one bit of one quant of block 1 (34 bytes a block)
        return data

    broken = rewrite(drafter / "q8_0.gguf", tmp_path / "broken.gguf", change=flip)
    v = verify_file(broken, tiny / "drafter-bf16", vocab_from=tiny / "target.gguf")
    assert not v.ok()
    assert len(v.failures) == 1 and "tensor blk.2.ffn_up.weight" in str(v.failures[0])
