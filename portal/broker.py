"""The embedded-defaults Celery broker: kombu's filesystem transport, with messages that appear whole.

kombu's filesystem channel creates a message's file in the queue folder and then writes it, while
a consumer renames away any file it finds there, without taking the writer's lock. A worker that
picks a file in between reads an empty message and dies on it (``JSONDecodeError``): the soak
bench (``bench/soak.py``) hit it within minutes. Here a message is written under a name consumers
skip, then renamed into place, which is atomic within one folder.
"""

import os
import uuid
from time import monotonic

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):  # kombu's, with the file renamed into place
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        # Consumers take files named "<anything>.<queue>.msg"; a leading dot puts the queue elsewhere.
        partial = os.path.join(self.data_folder_out, f".{name}.partial")
        with open(partial, "wb") as file:
            file.write(str_to_bytes(dumps(payload)))
        os.rename(partial, os.path.join(self.data_folder_out, name))


class Transport(filesystem.Transport):
    Channel = Channel
