"""How benchmarks/published_runs.py reads a row of data/published_runs.csv into a plan
and the settings of the framework that ran it."""

from published_runs import published_runs


def _row(row_id):
    return next(r for r in published_runs() if r.row_id == row_id)


def test_a_row_that_shares_another_rows_config_takes_its_interleaving():
    # K22-ABS-01 leaves VPP empty and says "config assumed same as Sec 6.3 row"; K22-S63-01
    # (Sec. 6.3 text) is "interleaved, m=3".
    assert _row("K22-ABS-01").pins["vpp"] == _row("K22-S63-01").pins["vpp"] == 3


def test_runs_of_2021_megatron_have_no_async_tp_all_reduce():
    assert _row("N21-T1-05").runtime_settings == {"tp_bwd_overlap": False,
                                                  "overlap_grad_reduce": False,
                                                  "transformer_impl": "local"}
    assert _row("K22-T5-02-sel").runtime_settings == {"overlap_grad_reduce": False,
                                                      "transformer_impl": "local"}
    assert _row("N21-T2-04").runtime_settings == {}  # DeepSpeed ZeRO-3 has no TP


def test_a_stated_dp_all_reduce_without_overlap_is_a_runtime_setting():
    # K22-S63-01 notes: "no overlap of DP gradient all-reduce with backprop".
    assert _row("K22-S63-01").runtime_settings == {"dp_overlap": 0.0,
                                                   "overlap_grad_reduce": False,
                                                   "transformer_impl": "local"}


def test_megatron_runs_before_2023_reduce_gradients_after_the_backward():
    # Megatron-LM's --overlap-grad-reduce dates from 2023; the 2021-22 papers ran local DDP.
    rows = [r for r in published_runs() if r.runtime == "megatron"]
    assert rows and all(r.runtime_settings["overlap_grad_reduce"] is False for r in rows)


def test_megatron_runs_before_2023_ran_megatrons_own_kernels_not_transformer_engine():
    # Transformer Engine came to Megatron-LM with --transformer-impl (2023): N21 and K22 ran
    # apex FusedLayerNorm and Megatron's jit fusions (costmodels/fused_kernels.py, local).
    rows = [r for r in published_runs() if r.runtime == "megatron"]
    assert rows and all(r.runtime_settings["transformer_impl"] == "local" for r in rows)
