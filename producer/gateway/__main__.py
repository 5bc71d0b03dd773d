"""`python -m embedfleet.producer.gateway`: what `embedfleet gateway` and `embedfleet up` run."""

import sys

from embedfleet.producer.gateway import main

sys.exit(main())
