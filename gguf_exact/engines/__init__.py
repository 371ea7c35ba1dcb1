"""The two engines' servers behind one settings model and one run folder.

- :mod:`.settings`: :class:`~.settings.ServeSettings` (the one settings model) and every serving default;
- :mod:`.process` (run folder, /proc identity, ports), :mod:`.http` (the client),
  :mod:`.status` (``status``, ``stop``), :mod:`.stats`, :mod:`.speculation`, :mod:`.rpc_probe` (an RPC
  worker's answer): what both engines use;
- :mod:`.llama_server` and :mod:`.llama_cpp_python`: one module per engine (neither imports
  the other; the llama-cpp-python engine runs :mod:`gguf_exact.speculative` in its process);
- :mod:`.launch` (``plan_launch``, ``start_server``), :mod:`.serve` (``serve`` as two
  calls), :mod:`.drafter_lookup` (the drafter for a target), :mod:`.logged_buffers`
  (llama-server's logged buffers beside the memory plan), :mod:`.rpc_worker` (``rpc-server``:
  llama.cpp's RPC worker, for ``serve --rpc``).
"""
