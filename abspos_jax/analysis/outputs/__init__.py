"""What an analysis writes and how analyses are read back: summary.json's keys (``schema``), the files, all or
nothing (``writer``: summary.json, stats.npz, ``report`` and ``figures``), emergence curves and ``--all_steps``
(``curves``), and ``--compare`` (``compare``: runs side by side; ``family``: seed families with intervals)."""
