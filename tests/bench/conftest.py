"""Tests of the benchmarks in bench/: each bench measures what it is named for. Marked `bench` (with
tests/fidelity, which tests bench/fidelity.py and the tools that trained its models): `pytest -m "not bench"`
runs the library's tests alone; CI runs both."""
