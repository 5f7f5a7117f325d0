"""The input edge: reading the files a user gives rollout (plans, inventories, facts).

Regular files only, bounded in size, UTF-8 (inputfile); YAML with the line and column of every
value (yamlsource, yamllines) under limits on depth, size and characters (yamllimits); field
problems worded for a user (fieldproblems); whole numbers from text rollout did not write
(wholenumber); the strict field types and the name and label checks every plan model shares,
the kinds' models included (fieldtypes). It imports nothing of rollout but rollout.errors.
"""
