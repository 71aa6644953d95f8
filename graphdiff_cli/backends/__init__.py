"""The only place faiss, torch devices and sentence-transformers are touched; all imported lazily."""
