"""``publish``: a release a publisher can ship, and its upload.

:mod:`.release` verifies the file against its source, gathers what a reader needs
(sha256 and size, the source repo and revision, exactness per kind of tensor, the quality
table when one was measured, the commands that reproduce and check the file), writes the
release folder (the file and its model card, :mod:`.card`) through the shared write path
and uploads it with :func:`gguf_exact.hub.upload.upload_folder`. It sits above ``verify``
and ``quality`` (whose results it renders), so not in ``hub/``, which holds only the Hub
side of the upload.
"""
