"""Pure numerics: arrays in, results out. numpy/scipy at import time; torch only inside functions."""
