"""tools/dhs_vocabulary.py: the vocabularies of the C++ programs that the Python tools use, in ONE Python place
(issue 23, one list per vocabulary). The C++ lists are the owners; each tuple here is their copy, in their order, and
tests/tools/vocabulary_test.cc (VocabularyPython) reads this file and fails when a tuple differs from its owner:

- WORKER_MODES: workerd's serving modes (workerd/serving_mode.h, kWorkerModes; dhs-replay / workerd --mode);
- RECLAIM_POLICIES: memd's reclaim policies (memd/reclaim_policy.h, kReclaimPolicyNames; --reclaim-policy), and
  DEFAULT_RECLAIM_POLICY (kDefaultReclaimPolicy);
- MODEL_PRESETS: the model presets (workerd/model/config.h, kPresetNames; --preset);
- SPECULATE_MODES: --speculate's modes (workerd/speculation/speculation_flags.h, kSpeculateModes);
- PREFIX_SHARING_MODES: memd --prefix-sharing (memd/memd_flags.h, PrefixSharingModes; issue 24);
- PREFIX_EVICTION_POLICIES: memd --prefix-eviction (memd/prefix_pages.h, kPrefixEvictionPolicyNames; issue 24).

Write each tuple on one line: the test reads `NAME = ("a", "b", ...)`.
"""

WORKER_MODES = ("resident", "hisparse", "adaptive")
RECLAIM_POLICIES = ("oldest-first", "newest-first", "largest-first")
DEFAULT_RECLAIM_POLICY = "largest-first"
MODEL_PRESETS = ("dsv4flash-like", "glm5-like", "bench-wide")
SPECULATE_MODES = ("off", "fixed", "confidence", "synthetic")
PREFIX_SHARING_MODES = ("off", "on")
PREFIX_EVICTION_POLICIES = ("lru", "fifo")
