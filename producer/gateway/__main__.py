"""`python -m producer.gateway`: what `embedfleet gateway` and `embedfleet up` run."""

import sys

from producer.gateway import main

sys.exit(main())
