#!/usr/bin/env python3
"""Move the carried llama.cpp patches (gguf_exact/builds/patches/) to another llama.cpp checkout.

    scripts/rebase_patches.py ~/src/llama.cpp                  # apply the series on a new branch, name each conflict
    scripts/rebase_patches.py --pinned /tmp/llama.cpp-pinned   # the same on a git repo made from the pinned sdist
    scripts/rebase_patches.py ~/src/llama.cpp --export         # write the branch back to gguf_exact/builds/patches/

The procedure is in docs/building-llama-cpp.md ("Moving the patches to a newer llama.cpp");
a thin wrapper over gguf_exact.builds.patch_series.
"""

import sys

from gguf_exact.builds.patch_series import main

if __name__ == "__main__":
    sys.exit(main())
