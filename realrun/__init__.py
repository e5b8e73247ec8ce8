"""draftsim's real-model layer (``draftsim.realrun``): the same policies as the simulators,
executed on Hugging Face models.

Modules
-------
models      loading: the embedded SmolLM2 (GGUF), tiny random models built from configs
drafters    drafters that propose tokens: Bigram, MaxGram, a neural draft model
prompts     the project's own prompt sets (no downloads)
kvcache     the one KV cache (BatchKV: ragged rows, rollback, trim, compaction; a batch of
            one for the single-stream executors)
executor    one round loop for every chain policy (single stream)
trees       token trees and graphs drafted and verified in one forward per level
methods     the real-run methods (`draftsim run`): specs checked before any model loads
serving     real batched serving: continuous batching driven by the serving simulator's
            scheduler (draftsim.sim.serving.scheduler); every step executed and recorded
servetrace  serving traces (what the server did, step by step)
record      recordings of two models' agreement token by token (traces)
runs        run traces of the single-stream executors
profiling   measured cost profiles of forward calls on this machine
compare     the simulator's prediction held against a real run
distill     a distilled draft model
head        SpecDec++'s acceptance head: data, training, inference
"""

if __name__ != "draftsim.realrun":  # one tree: the folder is installed as draftsim.realrun
    raise ImportError(f"import draftsim.realrun, not {__name__}: the folder realrun/ is installed as draftsim.realrun "
                      "(pyproject package-dir); a second copy would hold other classes (e.g. another DraftsimError)")

