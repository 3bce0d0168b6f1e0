"""``python -m devkit.demo``: the same as ``gpufrag demo``."""

import sys

from devkit.demo.cli import main

sys.exit(main())
