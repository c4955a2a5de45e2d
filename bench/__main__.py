"""``python -m bench`` (``make bench``): every benchmark, one table. See bench/run_all.py."""

import sys

from bench.run_all import main

sys.exit(main())
