"""`python -m producer.gateway`: what `embedfleet gateway` and `embedfleet up` run."""

from producer.gateway import main

main()
