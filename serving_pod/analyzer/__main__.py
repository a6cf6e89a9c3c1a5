"""``python -m serving_pod.analyzer`` runs ``ferry-analyzer``."""

import sys

from serving_pod.analyzer.cli import main

sys.exit(main())
