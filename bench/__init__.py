"""mstar benchmarks: load generator, peers (HF transformers, llama.cpp llama-server), transport
ceiling and the report. `python -m bench.run --help`."""
