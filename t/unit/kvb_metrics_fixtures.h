/*
 * Fixtures of kvbridge's metrics tests: /metrics text shaped as vLLM and
 * SGLang write it (HELP and TYPE lines, histograms, labels per engine,
 * rank and model).
 */

#ifndef _KVB_METRICS_FIXTURES_H_INCLUDED_
#define _KVB_METRICS_FIXTURES_H_INCLUDED_


/* vLLM v1, two engines (data parallel): running 7 + 5, waiting 2 + 1 */
extern const char  kvb_fx_vllm_text[];
/* vLLM before v0.10: gpu_cache_usage_perc, no engine label */
extern const char  kvb_fx_vllm_old_text[];
/* SGLang, two DP ranks, CRLF line ends */
extern const char  kvb_fx_sglang_text[];


#endif /* _KVB_METRICS_FIXTURES_H_INCLUDED_ */
