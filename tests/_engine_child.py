"""A child process for the Vulkan tests: the Python engine loaded through a serving profile
(``load_with_drafter(profile=...)``) in whatever llama-cpp-python ``PYTHONPATH`` puts first,
its completions' tokens and draft counts printed as one JSON line on stdout (llama.cpp's own
log on stderr with ``verbose``). The test process keeps the CPU bindings it imported; the
Vulkan bindings run here only.

Usage: python tests/_engine_child.py JOB.json, where JOB has target, drafter (or null),
profile, overrides, prompts, samplings (create_completion keyword sets), n_predict, verbose.
"""

from __future__ import annotations

import json
import sys


def main(job_path: str) -> None:
    job = json.loads(open(job_path).read())
    import llama_cpp

    from gguf_exact.engines.python.bindings import gpu_backends, gpu_devices
    from gguf_exact.engines.python.load import load_with_drafter

    llm = load_with_drafter(
        job["target"], job["drafter"], profile=job["profile"], overrides=job["overrides"], verbose=job["verbose"]
    )
    answers = []
    try:
        for prompt in job["prompts"]:
            for sampling in job["samplings"]:
                out = llm.create_completion(prompt, max_tokens=job["n_predict"], **sampling)
                g = llm.last_generation
                answers.append(
                    {"text": out["choices"][0]["text"], "tokens": g.tokens, "drafted": g.drafts_generated,
                     "accepted": g.drafts_accepted}
                )  # fmt: skip
    finally:
        llm.close()
    report = {
        "bindings": llama_cpp.__file__,
        "backends": gpu_backends(),
        "devices": [d.line() for d in gpu_devices()],
        "answers": answers,
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
