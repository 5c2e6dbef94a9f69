"""Experiments: the four arms (baseline, quantized, speculative, both) on the same traffic sample,
judged by cost per accepted answer within the latency SLOs and the baseline's quality."""
