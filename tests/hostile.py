"""A corpus of broken and hostile inputs, made on the spot from the tiny drafter: each
case is a function that breaks one thing in a copy of a good input (issue 10 §4).

Safetensors and config cases break the HF folder; GGUF cases break a GGUF file. Each
returns the path of the broken file (or folder) and the text the error must carry."""

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np

# --- safetensors --------------------------------------------------------------------------


def _split(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _join(path: Path, header: dict | bytes, data: bytes, length: int | None = None) -> None:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)


def _first(header: dict, name: str = "model.norm.weight") -> dict:
    return header[name]


def st_truncated(st: Path):
    raw = st.read_bytes()
    st.write_bytes(raw[: len(raw) - 1000])
    return "truncated"


def st_header_longer_than_file(st: Path):
    header, data = _split(st)
    _join(st, header, data, length=st.stat().st_size * 2)
    return "runs past the end of the file"


def st_header_length_2_63(st: Path):
    header, data = _split(st)
    _join(st, header, data, length=1 << 63)
    return "runs past the end of the file"


def st_header_not_json(st: Path):
    header, data = _split(st)
    text = json.dumps(header).encode()
    _join(st, b"{" + b"x" * (len(text) - 1), data)
    return "safetensors header: not valid JSON"


def st_header_not_an_object(st: Path):
    _, data = _split(st)
    _join(st, b"[1, 2, 3]", data)
    return "safetensors header is a JSON list, not an object"


def st_unknown_dtype(st: Path):
    header, data = _split(st)
    _first(header)["dtype"] = "Q7"
    _join(st, header, data)
    return "has dtype Q7"


def st_shape_as_string(st: Path):
    header, data = _split(st)
    _first(header)["shape"] = "64"
    _join(st, header, data)
    return "shape '64' is not a list of non-negative integers"


def st_offsets_as_floats(st: Path):
    header, data = _split(st)
    entry = _first(header)
    entry["data_offsets"] = [float(x) for x in entry["data_offsets"]]
    _join(st, header, data)
    return "is not a pair of integers"


def st_offsets_out_of_range(st: Path):
    header, data = _split(st)
    entry = _first(header)
    size = entry["data_offsets"][1] - entry["data_offsets"][0]
    entry["data_offsets"] = [len(data) + 64, len(data) + 64 + size]
    _join(st, header, data)
    return "truncated: tensor model.norm.weight ends at byte"


def st_overlapping(st: Path):
    header, data = _split(st)
    entries = sorted((e["data_offsets"][0], n) for n, e in header.items() if n != "__metadata__")
    _, second = entries[1]
    begin, end = header[second]["data_offsets"]
    header[second]["data_offsets"] = [begin - 2, end - 2]
    _join(st, header, data)
    return "overlaps the tensor before it"


def st_gap(st: Path):
    header, data = _split(st)
    for name, e in header.items():
        if name != "__metadata__":
            e["data_offsets"] = [e["data_offsets"][0] + 8, e["data_offsets"][1] + 8]
    _join(st, header, bytes(8) + data)
    return "belong to no tensor"


def st_shape_times_dtype_not_bytes(st: Path):
    header, data = _split(st)
    _first(header)["shape"] = [32]
    _join(st, header, data)
    return "bytes do not match shape [32] BF16"


def st_nan_in_matrix(st: Path):
    header, data = _split(st)
    e = header["model.layers.1.mlp.down_proj.weight"]
    data = bytearray(data)
    at = e["data_offsets"][0] + 2 * (3 * e["shape"][1] + 70)
    data[at : at + 2] = struct.pack("<H", 0x7FC0)
    _join(st, header, bytes(data))
    return "1 values are NaN or Inf (first at row 3, column 70)"


def st_inf_in_norm(st: Path):
    header, data = _split(st)
    e = header["model.norm.weight"]
    data = bytearray(data)
    at = e["data_offsets"][0] + 2 * 5
    data[at : at + 2] = struct.pack("<H", 0x7F80)
    _join(st, header, bytes(data))
    return "1 values are NaN or Inf (first at row 0, column 5)"


def st_zero_size(st: Path):
    header, data = _split(st)
    header["model.layers.0.extra.weight"] = {"dtype": "BF16", "shape": [0, 64], "data_offsets": [len(data), len(data)]}
    _join(st, header, data)
    return "has no values (shape [0, 64])"


SAFETENSORS = [
    st_truncated, st_header_longer_than_file, st_header_length_2_63, st_header_not_json,
    st_header_not_an_object, st_unknown_dtype, st_shape_as_string, st_offsets_as_floats,
    st_offsets_out_of_range, st_overlapping, st_gap, st_shape_times_dtype_not_bytes,
    st_nan_in_matrix, st_inf_in_norm, st_zero_size,
]  # fmt: skip


# --- hostile safetensors headers: too deep, too long a number, over the library's size -----------


def st_header_deep_brackets(st: Path):
    _, data = _split(st)
    _join(st, b"[" * 200_000, data)
    return "JSON nested deeper than 127 levels"


def st_header_deep_objects(st: Path):
    _, data = _split(st)
    _join(st, b'{"a":' * 100_000 + b"1" + b"}" * 100_000, data)
    return "JSON nested deeper than 127 levels"


def st_header_long_integer(st: Path):
    header, data = _split(st)
    _first(header)["shape"] = ["__LONG__"]
    _join(st, json.dumps(header).replace('"__LONG__"', "9" * 5000).encode(), data)
    return "model.norm.weight.shape[0]: an integer of 5,000 digits"


def st_header_over_library_limit(st: Path):
    _, data = _split(st)
    n = 100_000_001  # one byte over what the safetensors library takes; the file made sparse to hold it
    _join(st, b"{}", data, length=n)
    os.truncate(st, 8 + n + 64)
    return "header length 100,000,001 is over the safetensors library's limit of 100,000,000"


def st_name_with_a_newline(st: Path):
    header, data = _split(st)
    header["model.norm\nweight"] = header.pop("model.norm.weight") | {"dtype": "Q7"}
    _join(st, header, data)
    return "tensor model.norm\\nweight has dtype Q7"


def st_unreadable(st: Path):
    st.chmod(0)
    return "model.safetensors: cannot be read (Permission denied)"


BOUNDED_SAFETENSORS = [
    st_header_deep_brackets, st_header_deep_objects, st_header_long_integer, st_header_over_library_limit,
    st_name_with_a_newline, st_unreadable,
]  # fmt: skip


def shard(folder: Path) -> None:
    """Turn a single-file folder into an index plus one shard (same tensors)."""
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    header, _ = _split(folder / "model-00001-of-00001.safetensors")
    weight_map = {n: "model-00001-of-00001.safetensors" for n in header if n != "__metadata__"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def index_missing_shard(folder: Path):
    shard(folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return "lists shard model-00002-of-00002.safetensors, which is missing"


def index_extra_shard_tensor(folder: Path):
    shard(folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.norm.weight"]
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return "holds tensor model.norm.weight, which model.safetensors.index.json does not list"


def index_lists_absent_tensor(folder: Path):
    shard(folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.ghost.weight"] = "model-00001-of-00001.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return "lists tensor model.ghost.weight in model-00001-of-00001.safetensors, which does not hold it"


INDEX = [index_missing_shard, index_extra_shard_tensor, index_lists_absent_tensor]


def index_deep_nesting(folder: Path):
    shard(folder)
    (folder / "model.safetensors.index.json").write_text("[" * 200_000)
    return "model.safetensors.index.json: JSON nested deeper than 127 levels"


def index_long_integer(folder: Path):
    shard(folder)
    text = (folder / "model.safetensors.index.json").read_text()
    text = text.replace('"metadata": {}', '"metadata": {"total_size": ' + "1" * 5000 + "}")
    (folder / "model.safetensors.index.json").write_text(text)
    return "model.safetensors.index.json: metadata.total_size: an integer of 5,000 digits"


def index_sparse_3gb(folder: Path):
    shard(folder)
    os.truncate(folder / "model.safetensors.index.json", 3 << 30)  # sparse: costs no disk
    return "model.safetensors.index.json: 3,221,225,472 bytes, more than the 16,777,216"


BOUNDED_INDEX = [index_deep_nesting, index_long_integer, index_sparse_3gb]

# --- config.json -------------------------------------------------------------------------


def config_missing(folder: Path):
    (folder / "config.json").unlink()
    return "no config.json"


def config_not_json(folder: Path):
    (folder / "config.json").write_text("{architectures: nope")
    return "config.json: not valid JSON"


def config_wrong_types(folder: Path):
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = "four"
    (folder / "config.json").write_text(json.dumps(config))
    return "text_config.num_hidden_layers is 'four', expected an integer"


def config_wrong_architecture(folder: Path):
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    return "LlamaForCausalLM"


CONFIG = [config_missing, config_not_json, config_wrong_types, config_wrong_architecture]


def config_deep_objects(folder: Path):
    (folder / "config.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    return "config.json: JSON nested deeper than 127 levels"


def config_deep_arrays(folder: Path):
    (folder / "config.json").write_text('{"architectures": ' + "[" * 200_000)
    return "config.json: JSON nested deeper than 127 levels"


def config_long_integer(folder: Path):
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["vocab_size"] = "__LONG__"
    (folder / "config.json").write_text(json.dumps(config).replace('"__LONG__"', "9" * 5000))
    return "config.json: text_config.vocab_size: an integer of 5,000 digits"


def config_sparse_3gb(folder: Path):
    os.truncate(folder / "config.json", 3 << 30)  # sparse: costs no disk, and must not be read whole
    return "config.json: 3,221,225,472 bytes, more than the 16,777,216"


def config_unreadable(folder: Path):
    (folder / "config.json").chmod(0)
    return "config.json: cannot be read (Permission denied)"


BOUNDED_CONFIG = [config_deep_objects, config_deep_arrays, config_long_integer, config_sparse_3gb, config_unreadable]

# --- GGUF --------------------------------------------------------------------------------


def _gguf_header_end(raw: bytes) -> int:
    from gguf_exact.formats.gguf_layout import parse_header

    return parse_header(raw).data_start


def gguf_bad_magic(path: Path):
    raw = bytearray(path.read_bytes())
    raw[:4] = b"GGML"
    path.write_bytes(bytes(raw))
    return "not a GGUF file (starts with b'GGML')"


def gguf_version(path: Path):
    raw = bytearray(path.read_bytes())
    raw[4:8] = struct.pack("<I", 7)
    path.write_bytes(bytes(raw))
    return "GGUF version 7"


def gguf_truncated_header(path: Path):
    raw = path.read_bytes()
    path.write_bytes(raw[: _gguf_header_end(raw) // 2])
    return "truncated: the GGUF header runs past the end of the file"


def gguf_huge_counts(path: Path):
    raw = bytearray(path.read_bytes())
    raw[8:16] = struct.pack("<Q", 1 << 60)
    path.write_bytes(bytes(raw))
    return "implausible counts"


def gguf_huge_key_count(path: Path):
    raw = bytearray(path.read_bytes())
    raw[16:24] = struct.pack("<Q", 1 << 40)
    path.write_bytes(bytes(raw))
    return "implausible counts"


def gguf_huge_string(path: Path):
    raw = bytearray(path.read_bytes())
    raw[24:32] = struct.pack("<Q", 1 << 62)  # the first key's length
    path.write_bytes(bytes(raw))
    return "truncated: the GGUF header runs past the end of the file"


def gguf_data_beyond_end(path: Path):
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - 4096])
    return "truncated: tensor"


def gguf_misaligned(path: Path):
    from gguf_exact.formats.gguf_layout import parse_header

    raw = bytearray(path.read_bytes())
    header = parse_header(bytes(raw))
    last = header.tensors[-1]
    # the last tensor info ends with its u64 offset, just before the padding
    name = last.name.encode()
    at = raw.rindex(struct.pack("<Q", len(name)) + name)
    offset_at = at + 8 + len(name) + 4 + 8 * len(last.ne) + 4
    raw[offset_at : offset_at + 8] = struct.pack("<Q", last.offset + 4)
    path.write_bytes(bytes(raw))
    return "is not a multiple of the alignment"


GGUF = [
    gguf_bad_magic, gguf_version, gguf_truncated_header, gguf_huge_counts, gguf_huge_key_count,
    gguf_huge_string, gguf_data_beyond_end, gguf_misaligned,
]  # fmt: skip


def _insert_pair(path: Path, pair: bytes) -> None:
    """Add a key/value pair before the first one; ``pair`` a multiple of the alignment long,
    so the tensor data moves with it and every offset stays right."""
    raw = bytearray(path.read_bytes())
    assert len(pair) % 32 == 0, len(pair)
    (n_kv,) = struct.unpack_from("<Q", raw, 16)
    raw[16:24] = struct.pack("<Q", n_kv + 1)
    path.write_bytes(bytes(raw[:24]) + pair + bytes(raw[24:]))


def _pair_at(raw: bytes, key: str) -> int:
    """The offset of the pair whose key is ``key``."""
    name = key.encode()
    return raw.index(struct.pack("<Q", len(name)) + name)


def gguf_nested_arrays(path: Path):
    depth, key = 100_000, b"hostile.nested"
    body = struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * depth + struct.pack("<IQ", 0, 0)
    key += b"x" * (-(8 + len(key) + len(body)) % 32)
    _insert_pair(path, struct.pack("<Q", len(key)) + key + body)
    return f"key {key.decode()}: an array of arrays, which llama.cpp does not load"


def gguf_huge_array_count(path: Path):
    raw = bytearray(path.read_bytes())
    at = _pair_at(raw, "tokenizer.ggml.tokens") + 8 + len("tokenizer.ggml.tokens") + 4 + 4
    raw[at : at + 8] = struct.pack("<Q", (1 << 30) + 1)
    path.write_bytes(bytes(raw))
    return "key tokenizer.ggml.tokens: an array of 1,073,741,825 elements, more than llama.cpp's limit of 1,073,741,824"


def gguf_long_key(path: Path):
    raw = bytearray(path.read_bytes())
    raw[24:32] = struct.pack("<Q", 70_000)  # the first key's length; the file holds that many bytes
    path.write_bytes(bytes(raw))
    return "not a usable GGUF header (a key of 70,000 bytes, more than the GGUF format's limit of 65,535)"


def gguf_string_over_limit(path: Path):
    raw = bytearray(path.read_bytes())
    at = _pair_at(raw, "general.architecture") + 8 + len("general.architecture") + 4
    raw[at : at + 8] = struct.pack("<Q", (1 << 30) + 1)
    path.write_bytes(bytes(raw))
    os.truncate(path, (1 << 30) + (1 << 20))  # sparse: the string fits in the file
    return "key general.architecture: a string of 1,073,741,825 bytes, more than llama.cpp's limit of 1,073,741,824"


BOUNDED_GGUF = [gguf_nested_arrays, gguf_huge_array_count, gguf_long_key, gguf_string_over_limit]


# --- inputs that are not files, outputs that are not files (issue 16 §7) ---------------------
# Each returns (the path, what the error must say it is).


def path_directory(tmp: Path):
    (tmp / "a-folder.gguf").mkdir()
    return tmp / "a-folder.gguf", "is a directory, not a GGUF file"


def path_character_device(tmp: Path):
    return Path("/dev/null"), "is a character device, not a GGUF file"


def path_named_pipe(tmp: Path):
    import os

    os.mkfifo(tmp / "pipe.gguf")  # opening it would block: it must be refused before
    return tmp / "pipe.gguf", "is a named pipe, not a GGUF file"


NOT_FILES = [path_directory, path_character_device, path_named_pipe]


# --- server.json, as `status` and `stop` read it -----------------------------------------------


def state_not_json(state: Path):
    state.write_text("{pid: 12")
    return "not a readable server state (JSONDecodeError"


def state_not_an_object(state: Path):
    state.write_text("[1, 2]")
    return "a JSON list, not an object"


def state_missing_url(state: Path):
    data = json.loads(state.read_text())
    del data["url"]
    state.write_text(json.dumps(data))
    return "field url is missing, expected a JSON string"


def state_port_as_text(state: Path):
    data = json.loads(state.read_text())
    data["port"] = "8080"
    state.write_text(json.dumps(data))
    return "field port is '8080', expected a JSON number"


def state_pid_as_bool(state: Path):
    data = json.loads(state.read_text())
    data["pid"] = True
    state.write_text(json.dumps(data))
    return "field pid is True, expected a JSON number"


def state_binary(state: Path):
    state.write_bytes(b"\xff\xfe\x00garbage")
    return "not a readable server state (UnicodeDecodeError"


SERVER_STATE = [
    state_not_json,
    state_not_an_object,
    state_missing_url,
    state_port_as_text,
    state_pid_as_bool,
    state_binary,
]


def good_server_state(run_dir: Path, port: int) -> Path:
    """A run directory as `serve --detach` leaves it, for a server that has exited."""
    rdir = run_dir / str(port)
    rdir.mkdir(parents=True)
    state = {"pid": 999999, "start_time": 1, "engine": "llama-server", "port": port, "url": f"http://127.0.0.1:{port}"}
    (rdir / "server.json").write_text(json.dumps(state | {"target": "t.gguf", "drafter": None, "command": []}))
    (rdir / "server.pid").write_text("999999\n")
    return rdir / "server.json"


UNREADABLE = [st_unreadable, config_unreadable]


def broken_copy(good: Path, dest: Path, case) -> tuple[Path, str]:
    """Copy ``good`` (a folder or a file) to ``dest`` and apply ``case`` to it (a folder
    case gets the folder, a safetensors case the folder's model.safetensors)."""
    if good.is_dir():
        shutil.copytree(good, dest)
        target = dest / "model.safetensors" if case in SAFETENSORS + BOUNDED_SAFETENSORS else dest
    else:
        shutil.copy(good, dest)
        target = dest
    return dest, case(target)


__all__ = [
    "BOUNDED_CONFIG",
    "BOUNDED_GGUF",
    "BOUNDED_INDEX",
    "BOUNDED_SAFETENSORS",
    "UNREADABLE",
    "CONFIG",
    "GGUF",
    "INDEX",
    "NOT_FILES",
    "SAFETENSORS",
    "SERVER_STATE",
    "broken_copy",
    "good_server_state",
    "np",
]
