"""`python -m producer.cli.main` = `embedfleet`."""

import sys

from producer.cli.main import main

sys.exit(main())
