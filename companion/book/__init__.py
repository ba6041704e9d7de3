"""Running the chapters and building the book: ``companion reproduce`` and ``companion build-book``.

``reproduce`` reads the chapter list from ``_toc.yml`` (every entry under ``notebooks/``),
executes each notebook with papermill on the current interpreter, with parameters from a
profile (``profiles/<name>.yml``) plus ``-p NAME VALUE`` overrides, and then builds the HTML
book from the executed copies. Nothing is written over the sources:

- executed notebooks go to ``_build/executed/<chapter>.ipynb`` (a failed run's partial
  notebook to ``_build/failed/``),
- figures (``companion.figures.save_figure``) to ``figures/``,
- one entry per chapter to the run record ``_build/run-record.json``,
- the book to ``_build/html``.

Every output is written under a temporary name and renamed into place only when complete,
so a failure never leaves a half-written notebook, figure, record or book behind.
``build-book`` only does the last step, from whatever is in ``_build/executed``.

One module per job, data flowing one way (layout -> toc, parameters -> execute -> record ->
stage -> cli):

==================  ==========================================================================
module              owns
==================  ==========================================================================
``layout``          where a project's files are (:class:`Layout`, :func:`find_root`), the errors
``toc``             the chapter list read from ``_toc.yml``
``parameters``      profiles, each notebook's declared parameters, checking a run's values
``execute``         running one chapter with papermill, and what is recorded about the run
``record``          the run record and the reproduction-status page made from it
``figure_files``    publishing a run's figures, and their download links in the book
``offline``         the check that a built page loads nothing from another host
``api_page``        the API reference: an index and a page per subpackage (autodoc of each
                    listed module)
``stage``           staging the sources and building the HTML book with jupyter-book
``run``             :func:`reproduce`: execute, record, build
``cli``             ``companion reproduce`` and ``companion build-book``
``publish``         the published build's settings (install cells, launch buttons), for the
                    Pages workflow only
==================  ==========================================================================
"""
from companion.book.layout import Layout, ReproduceError, RunFailure, find_root
from companion.book.run import reproduce
from companion.book.stage import build_book

__all__ = ["Layout", "ReproduceError", "RunFailure", "build_book", "find_root", "reproduce"]
