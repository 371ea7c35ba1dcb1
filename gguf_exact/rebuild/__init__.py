"""``gguf-exact build``: a recipe's drafter rebuilt from its pinned source and held to the published file.

Above both the hub (pinned downloads) and the converters: :mod:`.build` fetches and
converts, :mod:`.outcome` compares the rebuild with the published GGUF block by block;
:mod:`.with_head` is ``fetch``'s drafter, its checkpoint converted here with its ordered head.
The hub itself knows nothing of converting.
"""
