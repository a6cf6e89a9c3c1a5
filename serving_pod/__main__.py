"""``python -m serving_pod`` is ``ferry-server``."""

import sys

from serving_pod.cli import main

sys.exit(main())
