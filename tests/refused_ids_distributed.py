"""A batch holding an id outside a table, under `keras.distribution` on JAX:
refused on every device of every process, with the refusal.

Run by `test_out_of_range_ids.py` (1 process of 4 devices) and
`test_jax_processes.py` (2 processes of 2 devices each, on 127.0.0.1):

    KERAS_BACKEND=jax XLA_FLAGS=--xla_force_host_platform_device_count=4 \
        python tests/refused_ids_distributed.py PROCESS PROCESSES PORT DIRECTORY

(DIRECTORY takes the weights saved in 1 process.) In 1 process it uses
`fit`, for each layout: the batch split over the 4 devices (`DataParallel`)
and over 2 of them, the table's rows sharded over the 4, both (a 2 x 2
mesh), and a stack of two tables sharded by rows; then it predicts outside a
distribution's scope with a model trained in it, and, with no Keras
distribution, calls the layer in a `jax.jit` under `jax.set_mesh` on ids
laid out over the devices. It fits a good batch, saves the weights, fits a
batch of two steps whose first holds id 99 and reads the table; loads the
weights and fits the good batch again, which must equal two uninterrupted
good fits bit for bit (the same compiled step on the same arrays). In 2
processes the table's rows are sharded across them and a `jax.jit` step (the
guide "Training across processes on JAX"'s) takes a batch holding id 99 on
its second step. Either way it prints, per layout, `refused LAYOUT: MESSAGE`
(the error's last line as JAX raised it, from `fit` or from the next use of
its results: JAX reports an error of a step partitioned over several devices
when its results are used); in 1 process `resumed LAYOUT: True` or `False`,
`sharded LAYOUT: PATH SPEC` (the table's layout) and `host checks LAYOUT:
N`, how often the host checked ids in the good batch's `fit`; in 2 processes
`trained on rows: True` once a step after the refusal has run. In 1 process
it also prints, for two tables apart and stacked, under `DataParallel` and
the 2 x 2 mesh, `gathers LAYOUT: N M`: how many all-gathers the compiled
training step holds outside the branches of its conditionals, with the check
(N) and with `out_of_range_ids="zeros"` (M, no check): the ids are gathered
for the refusal only in the branch that raises it.

Before, JAX ran the refusal's host callback on one device; its error left
the other devices waiting in the step's next collective until XLA aborted
the process after 40 s ("Termination timeout for all reduce"), and in 2
processes the other process failed without the refusal.
"""

import re
import sys

import keras
import numpy as np

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt.layers import ids as ids_module

ROWS, DIM, BATCH, BAD = 40, 4, 16, 99


def _batches(bad):
    rng = np.random.default_rng(3)
    ids = rng.integers(0, ROWS, (2 * BATCH, 3)).astype("int32")
    if bad:
        ids[5, 1] = BAD  # in the first step's batch
    return ids, np.ones((2 * BATCH, 3, DIM), "float32")


def _model(stacked):
    keras.utils.set_random_seed(1)
    ids = keras.Input((3,), dtype="int32")

    def table(rows, seed, name):
        return teo.layers.Embedding(
            rows,
            DIM,
            optimizer=teo.optimizers.Adagrad(0.2),
            embeddings_initializer=keras.initializers.RandomUniform(seed=seed),
            name=name,
        )

    if stacked:
        first, second = teo.layers.StackedEmbedding(
            [table(24, 2, "other"), table(ROWS, 1, "table")], name="stack"
        )([ids % 24, ids])
        outputs = first + second
    else:
        outputs = table(ROWS, 1, "table")(ids)
    model = keras.Model(ids, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    return model


def _refusal(error):
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else repr(error)


def _fit_layout(label, distribution, path):
    keras.distribution.set_distribution(distribution)
    try:
        model = _model(stacked=label == "stacked")
        good = _batches(bad=False)
        fit = dict(batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        # The host checks the ids (the refusal's callback) only for a batch
        # that has one outside a table.
        checked, check_ids = [], ids_module.check_ids
        ids_module.check_ids = lambda *a: checked.append(a) or check_ids(*a)
        try:
            model.fit(*good, **fit)
            np.asarray(model.weights[0].value)
        finally:
            ids_module.check_ids = check_ids
        print(f"host checks {label}: {len(checked)}")
        model.save_weights(path)
        try:
            model.fit(*_batches(bad=True), **fit)
            np.asarray(model.weights[0].value)
            print(f"refused {label}: not refused")
        except (ValueError, RuntimeError) as error:
            print(f"refused {label}: {_refusal(error)}")
        model.load_weights(path)
        model.fit(*good, **fit)
        reference = _model(stacked=label == "stacked")
        reference.fit(*good, **fit)
        reference.fit(*good, **fit)
        same = all(
            np.array_equal(np.asarray(a.value), np.asarray(b.value))
            for a, b in zip(model.weights, reference.weights)
        )
        print(f"resumed {label}: {same}")
        table = model.weights[0]
        print(f"sharded {label}: {table.path} {table.value.sharding.spec}")
    finally:
        keras.distribution.set_distribution(None)


def one_process(directory):
    import jax

    dist = keras.distribution
    devices = jax.devices()
    assert len(devices) == 4, devices
    # "two": the batch split over two of the devices, the smallest mesh that
    # is partitioned.
    layouts = {
        "data": dist.DataParallel(devices=devices),
        "two": dist.DataParallel(devices=devices[:2]),
    }
    for label, shape in (("rows", (1, 4)), ("both", (2, 2)), ("stacked", (2, 2))):
        layout_map = dist.LayoutMap(dist.DeviceMesh(shape, ("batch", "model"), devices))
        layout_map["table/embeddings"] = ("model", None)
        layout_map["stack/stack_0/embeddings"] = ("model", None)
        layouts[label] = dist.ModelParallel(
            layout_map=layout_map, batch_dim_name="batch"
        )
    for label, distribution in layouts.items():
        _fit_layout(label, distribution, f"{directory}/{label}.weights.h5")
    _outside_the_scope(layouts["rows"])
    _set_mesh_lookup()
    for label in ("data", "both"):
        for stacked in (False, True):
            counts = [
                _gathers_outside_branches(layouts[label], stacked, setting)
                for setting in ("error", "zeros")
            ]
            print(f"gathers {label}{'-stacked' * stacked}: {counts[0]} {counts[1]}")


def _outside_the_scope(distribution):
    """A model built and trained in the scope of a distribution, which keeps
    its tables' layout, predicting outside it."""
    with distribution.scope():
        model = _model(stacked=False)
        model.fit(*_batches(bad=False), batch_size=BATCH, verbose=0)
    try:
        model.predict(_batches(bad=True)[0], batch_size=BATCH, verbose=0)
        print("refused outside: not refused")
    except (ValueError, RuntimeError) as error:
        print(f"refused outside: {_refusal(error)}")


def _set_mesh_lookup():
    """The layer called in a `jax.jit` of one's own on ids laid out over 4
    devices, under `jax.set_mesh` (automatic axes, as Keras's) and no Keras
    distribution."""
    import jax
    from jax import sharding

    mesh = jax.make_mesh((4,), ("batch",), axis_types=(sharding.AxisType.Auto,))
    layer = teo.layers.Embedding(ROWS, DIM, optimizer="adagrad", name="table")
    layer.build()
    over_batch = sharding.NamedSharding(mesh, sharding.PartitionSpec("batch"))
    ids = jax.device_put(_batches(bad=True)[0][:BATCH], over_batch)
    with jax.set_mesh(mesh):
        try:
            jax.block_until_ready(jax.jit(layer)(ids))
            print("refused set_mesh: not refused")
        except (ValueError, RuntimeError) as error:
            print(f"refused set_mesh: {_refusal(error)}")


def _gathers_outside_branches(distribution, stacked, setting):
    """All-gathers in the compiled training step of two tables (`stacked` or
    not) with `out_of_range_ids=setting`, outside any conditional's branch."""
    import jax
    from keras.src.backend.jax import trainer

    compiled = {}
    jit = trainer.jit

    def recording_jit(function, **options):
        step = jit(function, **options)

        def run(*args):
            compiled["step"] = step.lower(*args).compile()
            return step(*args)

        return run

    keras.distribution.set_distribution(distribution)
    trainer.jit = recording_jit
    try:
        ids = keras.Input((2,), dtype="int32")
        tables = [
            teo.layers.Embedding(
                ROWS, DIM, optimizer="adagrad", out_of_range_ids=setting, name=f"t{k}"
            )
            for k in range(2)
        ]
        features = [ids[:, 0], ids[:, 1]]
        if stacked:
            outputs = teo.layers.StackedEmbedding(tables, name="stack")(features)
        else:
            outputs = [table(f) for table, f in zip(tables, features)]
        model = keras.Model(ids, keras.layers.Concatenate()(outputs))
        model.compile(optimizer="sgd", loss="mse")
        model.train_on_batch(np.zeros((BATCH, 2), "int32"), np.zeros((BATCH, 2 * DIM)))
    finally:
        trainer.jit = jit
        keras.distribution.set_distribution(None)
    assert jax.device_count() == 4 and "step" in compiled, compiled
    hlo = compiled["step"].as_text()
    # The check is a conditional; with "zeros" there is none.
    assert (" conditional(" in hlo) == (setting == "error"), setting
    return _count_outside_branches(hlo, "all-gather")


def _count_outside_branches(hlo, op):
    """How many `op`s (or their async starts) the HLO text holds outside the
    computations that are a conditional's branches."""
    bodies, name = {}, None
    for line in hlo.splitlines():
        start = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if start:
            name = start.group(1)
            bodies[name] = []
        elif name is not None:
            bodies[name].append(line)
    branches = set()
    for line in (line for body in bodies.values() for line in body):
        for listed in re.findall(r"branch_computations=\{([^}]*)\}", line):
            branches.update(n.strip().lstrip("%") for n in listed.split(","))
        branches.update(re.findall(r"(?:true|false)_computation=%?([\w.\-]+)", line))
    return sum(
        1
        for name, body in bodies.items()
        if name not in branches
        for line in body
        if re.search(rf" {op}(-start)?\(", line)
    )


def processes(process, count, port):
    import jax
    from jax import sharding
    from jax.experimental import multihost_utils

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", count, process)
    devices = np.array(jax.devices()).reshape(count, -1).T
    mesh = keras.distribution.DeviceMesh(devices.shape, ("batch", "model"), devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["table/embeddings"] = ("model", None)
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    )
    net = _model(stacked=False)
    dense = keras.optimizers.SGD(0.5)
    dense.build(net.trainable_variables)

    def loss(trainable, non_trainable, x, g):
        out, non_trainable = net.stateless_call(
            trainable, non_trainable, x, training=True
        )
        return (out * g).sum() / BATCH, non_trainable

    @jax.jit
    def step(trainable, non_trainable, state, x, g):
        grads, non_trainable = jax.grad(loss, has_aux=True)(
            trainable, non_trainable, x, g
        )
        trainable, state = dense.stateless_apply(state, grads, trainable)
        return trainable, non_trainable, state

    state = (
        [v.value for v in net.trainable_variables],
        [v.value for v in net.non_trainable_variables],
        [v.value for v in dense.variables],
    )
    batch = sharding.NamedSharding(mesh.backend_mesh, sharding.PartitionSpec("batch"))
    good, bad = _batches(bad=False), _batches(bad=True)

    def placed(arrays, part):
        rows = slice(part * BATCH, (part + 1) * BATCH)
        return [jax.make_array_from_process_local_data(batch, a[rows]) for a in arrays]

    kept = step(*state, *placed(good, 0))
    try:
        jax.block_until_ready(step(*kept, *placed(bad, 0)))
        print("refused rows: not refused")
    except (ValueError, RuntimeError) as error:
        print(f"refused rows: {_refusal(error)}")
    # The step's arrays were not donated: the job trains on from them.
    trained = step(*kept, *placed(good, 1))[0][0]
    whole = multihost_utils.process_allgather(trained, tiled=True)
    print(f"trained on rows: {np.isfinite(whole).all() and whole.shape == (ROWS, DIM)}")
    keras.distribution.set_distribution(None)
    # As the guide advises: JAX raises the refused step's error again as the
    # process exits, before it leaves the job (`clean_up`), and the others
    # then abort.
    jax.distributed.shutdown()


if __name__ == "__main__":
    process, count, port = (int(a) for a in sys.argv[1:4])
    if count == 1:
        one_process(sys.argv[4])
    else:
        processes(process, count, port)
