"""The ship check from a shell (lesson 10): is the model you saved the model you trained?

    python -m course_utils.ship --trained DIR --saved DIR [--base DIR] [--json]

Loads ``--saved`` as a user or a serving stack would (an adapter on its base, or the full directory) and
compares it with ``--trained``: logits on probe chats, stopping on the end-of-turn token with the saved
``generation_config``, the chat template, the special tokens' rows, the dtype. Exit 0 when it is the
trained model, 1 with what differs and the fix, 2 on bad input. The checks live in
``course_utils.shipping`` (``ship_report``, the same in a notebook).
"""

import sys

from .shipping import main

if __name__ == "__main__":
    sys.exit(main())
