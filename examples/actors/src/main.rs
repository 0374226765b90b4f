//! `hostmesh-actors-example [NAMESPACE] [PROCMESH]` (default `default`,
//! `echo`): runs the example against a cluster from `KUBECONFIG`; exits 0
//! only when every rank replied and the ended rank's event arrived. Its
//! last line says what it saw.

#[expect(
    clippy::print_stdout,
    reason = "an example program's output is its report"
)]
fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let namespace = args.next().unwrap_or_else(|| "default".into());
    let name = args.next().unwrap_or_else(|| "echo".into());
    let rt = tokio::runtime::Runtime::new()?;
    let seen = rt.block_on(async {
        let kube = kube::Client::try_default().await?;
        hostmesh_actors_example::run(kube, &namespace, &name, |l| println!("{l}")).await
    })?;
    let ok = seen
        .replies
        .iter()
        .enumerate()
        .all(|(r, s)| s == &format!("{r}:hello"));
    anyhow::ensure!(ok, "not every rank replied as itself: {:?}", seen.replies);
    println!(
        "OK: {} ranks replied, rank {}'s proc end arrived as {:?}",
        seen.replies.len(),
        seen.ended.0,
        seen.ended.1
    );
    Ok(())
}
