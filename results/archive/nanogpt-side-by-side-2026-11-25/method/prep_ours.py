# our split (38 training works | 4 held-out plays), our vocabulary, in nanoGPT's format (uint16 .bin + meta.pkl)
import pickle, sys
import numpy as np
sys.path.insert(0, "/work/main/src")
from common import text
vocab = text.vocabulary()
read = {w: (text.CORPUS_DIR / "texts" / f"{w}_gut.txt").read_text() for w in text.WORKS}
train = "".join(read[w] for w in text.WORKS if w not in text.VALIDATION_WORKS)
val = "".join(read[w] for w in text.VALIDATION_WORKS)
for name, t in (("train", train), ("val", val)):
    np.array(text.encode(t, vocab).numpy(), dtype=np.uint16).tofile(f"/tmp/nanogpt/data/ours/{name}.bin")
pickle.dump({"vocab_size": len(vocab), "itos": dict(enumerate(vocab)), "stoi": {c: i for i, c in enumerate(vocab)}},
            open("/tmp/nanogpt/data/ours/meta.pkl", "wb"))
print(len(train), len(val), len(vocab))
