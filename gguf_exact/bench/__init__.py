"""Benchmarks, above both engines: ``run`` (``gguf-exact bench``: the target alone
against the drafter at each n-max), ``engines`` (the Python engine beside llama-server),
``real`` (speculation at the real size, ``make bench-real``) with ``pass_costs`` (what its
passes cost in-process, and the speed-up that predicts), ``load`` (many users at once,
``make bench-load``), ``tune`` (the best n-max,
saved as a profile), all reported by ``report`` (one model: arms, figures, JSON and
Markdown); ``plot``, ``prompt_set`` (``prompts/``)."""
