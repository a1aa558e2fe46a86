//! Seed "Rules of Workflows": a step output is limited to 1 MiB. Store large data
//! elsewhere (here a fake blob store standing in for R2 or S3) and return a reference.
//!
//! Run: `cargo run --example large_data_by_reference`

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cairn::prelude::*;

/// A fake blob store.
#[derive(Default)]
pub struct BlobStore(Mutex<HashMap<String, Vec<u8>>>);

impl BlobStore {
    fn put(&self, key: &str, data: Vec<u8>) {
        self.0.lock().expect("lock").insert(key.to_owned(), data);
    }
    fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.0.lock().expect("lock").get(key).cloned()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct DataRef {
    key: String,
    bytes: usize,
}

/// Fetches a large dataset, stores it by reference and processes it.
pub struct LargeData {
    /// Where large data goes.
    pub blobs: Arc<BlobStore>,
}

fn large_dataset() -> Vec<u64> {
    (0..400_000).collect() // ~2.7 MB as JSON: too large for a step output
}

impl Workflow for LargeData {
    const NAME: &'static str = "large-data";
    type Params = ();
    type Output = (String, u64);

    async fn run(
        &self,
        _: WorkflowEvent<()>,
        step: WorkflowStep,
    ) -> Result<(String, u64), WorkflowError> {
        // 🔴 Returning the data itself fails the step: it is over the 1 MiB limit.
        let too_large = step
            .run("fetch large dataset", |_| async { Ok(large_dataset()) })
            .await;
        let error = too_large.expect_err("over the limit").message().to_owned();

        // ✅ Store it externally and return a reference.
        let data_ref: DataRef = step
            .run("fetch and store large dataset", |ctx| {
                let blobs = self.blobs.clone();
                async move {
                    let bytes = serde_json::to_vec(&large_dataset())?;
                    let key = format!("dataset-{}", ctx.idempotency_key().replace('/', "_"));
                    let len = bytes.len();
                    blobs.put(&key, bytes);
                    Ok(DataRef { key, bytes: len })
                }
            })
            .await?;
        // Read it back in a later step, when needed.
        let sum: u64 = step
            .run("process dataset", |_| {
                let (blobs, key) = (self.blobs.clone(), data_ref.key.clone());
                async move {
                    let stored = blobs.get(&key).ok_or("the blob is missing")?;
                    let data: Vec<u64> = serde_json::from_slice(&stored)?;
                    Ok(data.iter().sum())
                }
            })
            .await?;
        Ok((error, sum))
    }
}

/// Runs the example; returns the size error and the processed sum.
pub async fn demo(
    builder: cairn::EngineBuilder,
) -> Result<(String, u64), Box<dyn std::error::Error>> {
    let engine = builder
        .register(LargeData {
            blobs: Arc::new(BlobStore::default()),
        })
        .start()
        .await?;
    let instance = engine
        .workflow::<LargeData>()
        .create(CreateOptions::new(()))
        .await?;
    let (error, sum) = instance.wait().await?.output.ok_or("the instance failed")?;
    println!("returning the data directly: {error}");
    println!("by reference: processed the dataset, sum = {sum}");
    engine.shutdown().await;
    Ok((error, sum))
}

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    demo(Engine::builder().temporary()).await?;
    Ok(())
}
