"""Serving: the two engines behind one settings model, one configuration and one run folder.

Three folders, from the bottom:

- :mod:`.shared`: what both engines use. :mod:`.shared.settings` (:class:`ServeSettings`, the one
  settings model, and every serving default); the serving configuration (:mod:`.shared.knobs`, each
  knob declared once; :mod:`.shared.serving_config`, a profile parsed once and rendered for either
  engine and the memory plan; :mod:`.shared.profiles`, the TOML files; :mod:`.shared.profile_choice`
  and :mod:`.shared.gpus`); the memory plan (:mod:`.shared.memory_plan`, :mod:`.shared.device_plan`,
  :mod:`.shared.weight_placement`, :mod:`.shared.compute_estimate`); the draft-length policy
  (:mod:`.shared.draft_policy`, the twin of llama-server's patch); the run folder and processes
  (:mod:`.shared.process`), the HTTP client (:mod:`.shared.http`), ``status``/``stop``
  (:mod:`.shared.status`), the request guard, the RPC probes, the counters.
- the engines, neither importing the other: :mod:`.llama_server` (llama.cpp's ``llama-server``: its
  command line) and :mod:`.python` (the in-process engine on llama-cpp-python: ``load_with_drafter``,
  the drafter, ``chat``, the runner, its OpenAI server and :mod:`.python.server_main`, the process
  ``serve --engine python`` starts).
- this folder's modules drive either engine: :mod:`.launch` (``plan_launch``, ``start_server``),
  :mod:`.serve` (``serve`` as two calls), :mod:`.drafter_lookup` (the drafter for a target),
  :mod:`.device_check`, :mod:`.logged_buffers` (llama-server's logged buffers beside the memory plan),
  :mod:`.rpc_worker` (``rpc-server``, llama.cpp's RPC worker, for ``serve --rpc``).
"""
