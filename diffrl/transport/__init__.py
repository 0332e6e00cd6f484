"""How a reward call gets to where it runs and back: a call thread or worker process, with deadlines
(``workers``), or a reward server over HTTP (``client``, speaking a wire protocol of ``protocols``).
Below rewards/, which builds on it; imports nothing of diffrl but core."""
