"""From an analysed spec to loop nests: the loop IR (``loops``, the contract with every printer) and the
lowering that builds it (``lower``)."""
