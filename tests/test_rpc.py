"""RPC serving without a build: the build's record, the worker protocol against a fake worker,
the worker's safety rules, the per-device memory plan. (With real workers on loopback:
tests/test_rpc_loopback.py.)"""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from gguf_exact import doctor
from gguf_exact.builds import llama_build
from gguf_exact.engines import rpc_probe
from helpers import sdist_files


@pytest.fixture(scope="module")
def sdist():
    return llama_build.fetch_sdist(llama_build.pinned_sdist(), log=lambda _m: None)


def test_the_build_records_its_rpc_protocol_from_the_pinned_source(sdist, tmp_path):
    src = sdist_files(sdist, {llama_build.RPC_HEADER}, tmp_path)
    record = llama_build.rpc_record(src)
    assert record == {"ggml_rpc": True, "server": "rpc-server", "protocol": "7.0.0"}
    # the probe speaks the protocol the build's header declares
    assert int(record["protocol"].split(".")[0]) == rpc_probe.PROTOCOL_MAJOR
    (src / llama_build.RPC_HEADER).write_text("#define RPC_PROTO_MAJOR_VERSION 7\n")  # minor and patch gone
    with pytest.raises(llama_build.BuildError, match="ggml-rpc.h: no RPC_PROTO_"):
        llama_build.rpc_record(src)


def test_doctor_names_the_rpc_server_a_build_holds():
    rpc = {"ggml_rpc": True, "server": "rpc-server", "protocol": "7.0.0"}
    assert doctor.describe_build({"rpc": rpc, "build_seconds": 900}) == (
        "rpc-server, GGML_RPC=ON, RPC protocol 7.0.0, built in 900 s"
    )
    # a build made before the record: its CMake arguments say so
    assert doctor.describe_build({"cmake": ["-DGGML_RPC=ON"]}) == "rpc-server, GGML_RPC=ON"
    assert doctor.describe_build({"cmake": ["-DGGML_CUDA=ON"]}) == ""
