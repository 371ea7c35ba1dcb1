"""``gguf-exact build``: a recipe's drafter rebuilt from its pinned source and held to the published file.

Above both the hub (pinned downloads) and the converters: :mod:`.build` fetches and
converts, :mod:`.outcome` compares the rebuild with the published GGUF block by block.
The hub itself knows nothing of converting.
"""
