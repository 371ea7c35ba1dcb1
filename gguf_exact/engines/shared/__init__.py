"""What both engines (llama-server and the Python engine) share: ``profiles``
(``serve/*.toml``), ``profile_choice`` and ``gpus`` (which profile fits this machine),
``sampling_defaults``, ``memory_plan`` (memory from the headers), ``engine_options``
(a profile for the Python engine) and ``generation`` (the counters every run reports)."""
