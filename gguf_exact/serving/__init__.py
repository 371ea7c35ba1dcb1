"""llama-server with draft-mtp: ``llama_build`` (from the pinned sdist), ``profiles``
(``serve/``), pre-launch ``checks``, ``server`` (serve/status/stop), ``stats``
(/metrics and log lines), ``client`` and ``doctor``."""
