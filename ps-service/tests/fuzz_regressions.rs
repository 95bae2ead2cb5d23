//! Inputs the fuzz targets (fuzz/, `make fuzz`) found, kept as tests of the product's functions.
//!
//! The first three were a bug: `checkpoint::encode_to` names the optimizer state
//! `optimizer.mean_square.<tensor>` / `optimizer.momentum.<tensor>` and `expect`ed those names to
//! be valid and distinct from the model's. A model with a tensor named like that (`w` and
//! `optimizer.mean_square.w`), or a name longer than 512 − 22 bytes, was accepted (PUT /v1/model,
//! or a checkpoint file), and every checkpoint of it then panicked. Model layouts now refuse such
//! names (`Layout::model`).

use foresight_ps::optimizer::{Algorithm, Hyper};
use foresight_ps::store::Store;
use foresight_ps::store::checkpoint;
use foresight_ps::wire::{self, Layout, TensorSpec};

/// dc-asgd-a with momentum: both kinds of optimizer state are checkpointed.
fn hyper() -> Hyper {
    let mut h = Hyper::new(Algorithm::DcAsgdA, 0.1);
    h.momentum = 0.9;
    h
}

/// The PS's next checkpoint of `store`: writing it must not panic, and what it wrote must decode.
fn checkpoint_of(store: &Store) {
    let mut out = Vec::new();
    if checkpoint::encode_to(&mut out, store.layout(), store.hyper(), &store.checkpoint()).is_ok() {
        checkpoint::decode(&out).expect("a checkpoint the PS wrote decodes");
    }
}

/// fuzz target `checkpoint`, crash-65f6b083c7a61dfb658161b612bc0b3a92bac6a6: a checkpoint whose
/// `model_tensors` is 6, so that its three `optimizer.momentum.*` tensors are model tensors.
/// `decode` accepts it; the restored PS's first checkpoint panicked.
const MODEL_TENSORS_NAMED_LIKE_STATE: &[u8] =
    b"\xe0\x03\x00\x00\x00\x00\x00\x00{\"__metadata__\":{\"algorithm\":\"sync\",\"epoch\":\"1.5\
    \",\"finalized\":\"false\",\"format\":\"foresight-checkpoint/1\",\"hyperparameters\":\"{\\\
    \"algorithm\\\":\\\"sync\\\",\\\"lr\\\":{\\\"base\\\":0.05,\\\"factor\\\":1.0,\\\"mileston\
    es\\\":[],\\\"warmup\\\":0.0},\\\"lambda0\\\":0.0,\\\"mean_square_decay\\\":0.95,\\\"epsil\
    on\\\":1e-7,\\\"weight_decay\\\":0.0,\\\"momentum\\\":0.5,\\\"max_staleness\\\":null,\\\"c\
    ombine\\\":\\\"mean\\\",\\\"backup_workers\\\":0,\\\"safeguards\\\":{\\\"gainClamp\\\":tru\
    e,\\\"biasCorrection\\\":true}}\",\"model_tensors\":\"6\",\"version\":\"42\",\"worker_gene\
    rations\":\"[1,0,2]\",\"worker_seqs\":\"[3,null,9]\",\"workers\":\"3\"},\"conv.bias\":{\"d\
    ata_offsets\":[32,40],\"dtype\":\"F32\",\"shape\":[2]},\"conv.weight\":{\"data_offsets\":[\
    0,32],\"dtype\":\"F32\",\"shape\":[2,1,2,2]},\"fc\":{\"data_offsets\":[40,56],\"dtype\":\"\
    F32\",\"shape\":[4]},\"optimizer.momentum.conv.bias\":{\"data_offsets\":[88,96],\"dtype\":\
    \"F32\",\"shape\":[2]},\"optimizer.momentum.conv.weight\":{\"data_offsets\":[56,88],\"dtyp\
    e\":\"F32\",\"shape\":[2,1,2,2]},\"optimizer.momentum.fc\":{\"data_offsets\":[96,112],\"dt\
    ype\":\"F32\",\"shape\":[4]}}\x20\x20\x20\x20\x00\x00\x80?\x00\x00\xc0\xbf\xc2\x16\x01\x00\
    \xa5\xd4hS\xa5\xd4h\xd3\xf4\xfdT;\x00\x00\x00\x00\x00\x00\x00\x80\x00\x00\x80?\x00\x00\xc0\
    \xbf\xc2\x16\x01\x00\xa5\xd4hS\xa5\xd4h\xd3\xf4\xfdT;\x00\x00\x00\x00\x00\x00\x00\x00\x00\
    \x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\
    \x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\
    \x00\x00\x00";

#[test]
fn a_checkpoint_whose_model_tensors_are_named_like_optimizer_state() {
    // Refusing the file is a fix too.
    let Ok((layout, saved, _)) = checkpoint::decode(MODEL_TENSORS_NAMED_LIKE_STATE) else { return };
    checkpoint_of(&Store::restore(layout, saved, hyper(), 3));
}

/// The same through `PUT /v1/model`: the handler decodes the body with `wire::decode_model` and
/// builds the store with `Store::seeded`.
#[test]
fn a_registered_model_with_a_tensor_named_like_optimizer_state() {
    for names in [["w", "optimizer.mean_square.w"], ["w", "optimizer.momentum.w"]] {
        let layout =
            Layout::new(names.iter().map(|n| TensorSpec { name: n.to_string(), shape: vec![2] }).collect())
                .unwrap();
        let body = wire::encode_f32(&layout, &[1.0; 4], &Default::default());
        // Refusing the model is a fix too.
        let Ok((layout, values, _)) = wire::decode_model(&body) else { continue };
        checkpoint_of(&Store::seeded(layout, values, 0, hyper(), 1));
    }
}

#[test]
fn a_registered_model_with_a_name_too_long_for_the_state_prefix() {
    let layout =
        Layout::new(vec![TensorSpec { name: "n".repeat(wire::MAX_NAME_LEN), shape: vec![1] }]).unwrap();
    let body = wire::encode_f32(&layout, &[1.0], &Default::default());
    let Ok((layout, values, _)) = wire::decode_model(&body) else { return };
    checkpoint_of(&Store::seeded(layout, values, 0, hyper(), 1));
}

/// A model of more tensors than its checkpoint can hold with their optimizer state (three per
/// tensor, at most `wire::MAX_TENSORS` in a file) was accepted, and its checkpoint then
/// panicked. At the limit it is accepted and checkpoints; one more is refused.
#[test]
fn a_registered_model_with_more_tensors_than_its_checkpoint_can_hold() {
    let model = |n: usize| {
        let layout =
            Layout::new((0..n).map(|i| TensorSpec { name: format!("t{i}"), shape: vec![1] }).collect())
                .unwrap();
        wire::encode_f32(&layout, &vec![1.0; n], &Default::default())
    };
    let (layout, values, _) = wire::decode_model(&model(wire::MAX_MODEL_TENSORS)).unwrap();
    checkpoint_of(&Store::seeded(layout, values, 0, hyper(), 1));
    let Err(e) = wire::decode_model(&model(wire::MAX_MODEL_TENSORS + 1)) else {
        panic!("a model of {} tensors was accepted", wire::MAX_MODEL_TENSORS + 1)
    };
    assert!(e.to_string().contains("at most 33333"), "{e}");
}
