"""``python -m serving_pod.storage <uri> <dest>``: the storage initializer without the server CLI."""

import sys

from serving_pod.storage.cli import main

sys.exit(main())
