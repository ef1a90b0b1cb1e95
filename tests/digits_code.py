"""scikit-learn's digits for the scripts and kernels the tests start, read from
scikit-learn's own data file without importing scikit-learn: a fresh interpreter or kernel
spent ~3 s importing sklearn.datasets (SciPy, pandas) for a read of 50 ms, once per
script or kernel. ``LOAD_DIGITS`` is code that defines ``load_digits()`` where it runs,
answering as ``sklearn.datasets.load_digits`` does for ``data``, ``target`` and
``return_X_y`` (test_kernel's first test holds the two equal)."""

LOAD_DIGITS = '''
def load_digits(return_X_y=False):
    """scikit-learn's digits, read as sklearn.datasets.load_digits reads them."""
    import gzip, importlib.util, os, types, numpy
    package = list(importlib.util.find_spec("sklearn").submodule_search_locations)[0]
    with gzip.open(os.path.join(package, "datasets", "data", "digits.csv.gz")) as file:
        data = numpy.loadtxt(file, delimiter=",")
    target = data[:, -1].astype(int, copy=False)
    if return_X_y:
        return data[:, :-1], target
    return types.SimpleNamespace(data=data[:, :-1], target=target)
'''
