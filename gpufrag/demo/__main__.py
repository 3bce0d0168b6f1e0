"""``python -m gpufrag.demo``: the same as ``gpufrag demo``."""

import sys

from gpufrag.demo.cli import main

sys.exit(main())
