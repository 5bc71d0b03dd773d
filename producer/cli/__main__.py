"""`python -m embedfleet.producer.cli.main` = `embedfleet`."""

import sys

from embedfleet.producer.cli.main import main

sys.exit(main())
