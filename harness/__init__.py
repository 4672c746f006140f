"""What the tests and the benchmarks share: helpers that are not tests and import neither
``tests`` nor ``bench`` (tests/test_layout.py checks that), so a benchmark needs no test code.

- ``harness.processes``: reaping the processes real hivemind peers leave behind.
- ``harness.netlab``: test hosts in network namespaces on a bridge, each at its own rate.
- ``harness.hub_folder``: a dataset in a local folder laid out as the Hugging Face Hub lays one.
"""
